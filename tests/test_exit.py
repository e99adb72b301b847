"""The `sparqrl` script's exit (`sparqrl.entry.console`): after success it skips Python's teardown (issue 33), but
what Python's exit would run first still runs, and every exit status is the one `main` gives."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path

marks = Path(sys.argv[1])
atexit.register(lambda: (marks / "atexit").write_text("ran"))  # as W&B's finish or Ray's shutdown would

def late():  # a non-daemon thread Python's exit waits for
    time.sleep(0.5)
    (marks / "thread").write_text("ran")

threading.Thread(target=late).start()


class Teardown:  # what Python's module teardown would finalize
    def __del__(self):
        (marks / "teardown").write_text("ran")


kept = Teardown()
sys.argv = ["sparqrl", *sys.argv[2:]]
from sparqrl.entry import console
console()
print("not reached")
"""


def run_console(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), *argv], capture_output=True, text=True,
                          timeout=300)


def test_a_success_runs_the_exit_handlers_and_waits_for_threads(tmp_path):
    done = run_console(tmp_path, "train", "ppo", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--steps" in done.stdout and "not reached" not in done.stdout  # stdout flushed whole
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()  # the teardown skipped


def test_a_usage_error_keeps_its_status(tmp_path):
    done = run_console(tmp_path, "train", "ppo", "--no-such-flag")
    assert done.returncode == 2 and "--no-such-flag" in done.stderr


def test_the_script_is_the_console_entry_point():
    """pyproject.toml's `sparqrl` script runs `console` (the fast exit), not `main`."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["sparqrl"] == "sparqrl.entry:console"
