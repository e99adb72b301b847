"""The `sparqrl` command's entry point: Ctrl-C becomes a flag before anything heavy is imported
(`sparqrl.signals`), the seeds' CPU devices are chosen before JAX is (`sparqrl.devices`), then the
command line runs."""

from __future__ import annotations

import atexit
import os
import sys
import threading
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


def console() -> NoReturn:
    """The `sparqrl` script: `main`, then, after success, an exit without Python's module teardown and
    JAX/XLA's (0.7 s of a run's wall time on the 2-core CPU, issue 33: 2,500 modules, XLA's CPU client and its
    thread pools). The command's files are written and closed by then (`run_session` closes what it opened
    before it returns). What Python's exit does first still runs, in its order: threading's exit calls and the
    wait for non-daemon threads (`threading._shutdown`, as the interpreter calls it), then the atexit handlers
    (W&B's finish, Ray's shutdown, logging's flush). Every other ending is `main`'s own, and so is a success
    whose stdout cannot be flushed (its reader left): the exit status is what it always was. `main` itself
    raises SystemExit, for callers in a process that goes on."""
    try:
        main()
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    threading._shutdown()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        sys.exit(0)
    os._exit(0)


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
