"""The `sparqrl` command's entry point: Ctrl-C becomes a flag before anything heavy is imported
(`sparqrl.signals`), then the command line runs."""

from __future__ import annotations

import sys


def main() -> None:
    from sparqrl import devices, signals

    signals.install()
    devices.spread_seeds(sys.argv[1:])  # before JAX is imported
    from sparqrl.cli import main as cli_main

    sys.exit(cli_main())
