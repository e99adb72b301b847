"""The `sparqrl` command's entry point: Ctrl-C becomes a flag before anything heavy is imported
(`sparqrl.signals`), the seeds' CPU devices are chosen before JAX is (`sparqrl.devices`), then the
command line runs."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_with(code: int) -> NoReturn:
    """Exit with `code`. After a failure (its one line already printed, files closed), skip Python's
    shutdown: tensorstore's threads may still deliver a damaged checkpoint's failed reads to a closed
    event loop, which prints tracebacks the user did not cause."""
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main() -> None:
    from sparqrl import devices, signals

    signals.install()
    devices.spread_seeds(sys.argv[1:])  # before JAX is imported
    from sparqrl.cli import main as cli_main

    try:
        code = cli_main()
    except BrokenPipeError:  # `sparqrl --help | head`: the reader left; no traceback, as a killed C tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush
        code = 141  # 128 + SIGPIPE
    exit_with(code)
