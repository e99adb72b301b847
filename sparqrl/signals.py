"""Ctrl-C, SIGTERM and SIGHUP (a closed terminal or SSH session) as a flag, from the first line the command runs.

The command line installs the flag before its heavy imports (`sparqrl.entry`): a signal during imports,
set-up or XLA's compilation is then never a KeyboardInterrupt raised wherever Python happens to be (a
traceback, or one swallowed by a garbage-collection callback so the run went on), but a flag that the
run checks at its safe points (`StopRequests.check`). Each ends the same way (a checkpoint, one line);
the exit status says which came: 128 + SIGHUP after a hang-up, 130 otherwise. This module imports
nothing heavy on purpose.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_requested = False
_last: int | None = None  # the signal that set the flag last


def _request(signum: int, frame: Any) -> None:  # noqa: ARG001 - signal handler signature
    global _requested, _last
    _requested, _last = True, signum


def install() -> dict[int, Any]:
    """Take both signals over; returns the handlers they had."""
    return {sig: signal.signal(sig, _request) for sig in SIGNALS}


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """The signals' handlers as they were before the block, put back after it where it changed them: for a library
    that takes one over as it starts (`ray.init` makes SIGTERM exit the process). A run's `StopRequests`, installed
    after, would take a handler not its own for the sign of a new run from Python and clear the flag: a Ctrl-C or
    SIGTERM sent before was lost, and the run went on to the end of its budget."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None and signal.getsignal(sig) is not handler:  # (None: not set from Python)
                signal.signal(sig, handler)


def requested() -> bool:
    return _requested


def exit_status() -> int:
    """The command's exit status once a signal stopped it: 129 (128 + SIGHUP) after a hang-up, else 130
    (Ctrl-C's, kept for SIGTERM too, as before)."""
    return 128 + signal.SIGHUP if _last == signal.SIGHUP else 130


class StopRequests:
    """Ctrl-C, SIGTERM and SIGHUP become a flag that a runner checks at safe points (`check` raises
    KeyboardInterrupt there). Raised anywhere else, the interrupt could land inside TensorBoard's or
    orbax's writers (and hang the final close) or, on the host runner, while donated buffers are in
    flight. Both signals are taken over explicitly: a process started with SIGINT ignored (as
    pytest-xdist workers start their children) would otherwise run on through Ctrl-C. A signal that
    arrived before (the command line's flag, installed at its start) counts."""

    def __init__(self) -> None:
        global _requested, _last
        self._previous = install()
        if any(handler is not _request for handler in self._previous.values()):
            _requested, _last = False, None  # a new run from Python: an earlier run's Ctrl-C is not this one's

    @property
    def requested(self) -> bool:
        return _requested

    def check(self) -> None:
        if _requested:
            raise KeyboardInterrupt

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
