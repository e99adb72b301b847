"""Commands in a subprocess under a timeout, what the tests of "no command hangs" share (test_no_hang,
test_multidevice, test_interrupt_host): a hang fails the test, never waits, and everything it started is killed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 240  # a tiny run takes 10-40 s on a loaded 2-core machine; a hang is forever


def wait_bounded(process: subprocess.Popen, what: str, timeout_s: float = TIMEOUT_S) -> str:
    """The stderr of `process` (started with `start_new_session=True`) once it exits within `timeout_s`; else it and
    every process of its group are killed and the test fails, naming `what`."""
    try:
        return process.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{what} hung: no exit within {timeout_s:g} s")


def run_bounded(argv: list[str], out: Path, devices: int) -> dict:
    """`sparqrl ARGV --out OUT` on `devices` forced CPU devices: its summary.json; fails if it does not exit 0,
    without a traceback, within TIMEOUT_S."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    command = [str(Path(sys.executable).with_name("sparqrl")), *argv, "--out", str(out)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    err = wait_bounded(process, f"`sparqrl {shlex.join(argv)}` on {devices} CPU device(s)")
    assert process.returncode == 0 and "Traceback" not in err, err[-3000:]
    return json.loads((out / "summary.json").read_text())


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc's parent links): what a run started, to check none is left."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found
