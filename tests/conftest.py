import os

import pytest

# Tests run on the CPU, in float32, and must not grab all memory on a GPU machine.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Tests that start Ray run one after another in one xdist worker (`pytest -n 2 --dist loadgroup`): two Ray
# instances at once on this 2-core machine (one of them a cluster started with `ray start`) made actor
# start-ups fail.
RAY_SERIAL = pytest.mark.xdist_group("ray")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (read from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
