"""Third-party notices that tell a sparqrl user nothing, filtered where they arise (issue 34, "quiet by
default"): MuJoCo's deprecation of a compiler attribute that Gymnasium's own MuJoCo models use (one
warning per env built, dozens a run), and JAX's warning that a fork of its multithreaded process will
likely deadlock, where the fork is subprocess's, followed at once by exec. `sparqrl train|sweep --verbose`
shows them: it sets `VERBOSE_ENV` in the environment, which the processes a run starts (Ray's, its
actors) inherit."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator

from sparqrl.extras import available

VERBOSE_ENV = "SPARQRL_VERBOSE"
"""Set (to anything but '' or '0'): third-party notices are shown."""

MUJOCO_NOISE = ("compiler attribute 'settotalmass' is deprecated",)
"""Beginnings of MuJoCo warnings about models a user did not write (Gymnasium's XML files)."""

FORK_WARNING = r"os\.fork\(\) was called"
"""JAX's RuntimeWarning, given at every fork of a process that has imported it (`jax._src.xla_bridge`)."""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose() -> None:
    """Show third-party notices in this process and in every process it starts from now on."""
    os.environ[VERBOSE_ENV] = "1"


def mujoco_warning(message: str) -> None:
    """MuJoCo's warning handler: its `MUJOCO_NOISE` dropped unless verbose, every other warning printed as
    MuJoCo prints it (on stderr, though not also appended to MUJOCO_LOG.TXT in the working directory)."""
    if verbose() or not message.startswith(MUJOCO_NOISE):
        print(f"WARNING: {message}\n", file=sys.stderr)


def quiet_mujoco() -> None:
    """Route MuJoCo's warnings through `mujoco_warning` before it compiles a model. A handler the user set
    is kept; nothing happens where mujoco is not installed."""
    if not available("mujoco"):
        return
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(mujoco_warning)


def before_gym_make(env_id: str) -> None:
    """`quiet_mujoco` where Gymnasium's `env_id` is one of its MuJoCo envs (only those: importing mujoco
    costs a third of a second)."""
    import gymnasium as gym

    spec = gym.registry.get(env_id)
    if spec is not None and "mujoco" in str(spec.entry_point):
        quiet_mujoco()


@contextlib.contextmanager
def exec_forks() -> Iterator[None]:
    """A block whose forks are subprocess's, each followed at once by exec (Ray starting its processes,
    imageio starting ffmpeg): the child runs none of JAX's threads' code, so JAX's warning that the fork
    will likely deadlock does not apply and is not shown, unless verbose. Not thread-safe (warnings'
    filters are global): enter it before the run starts threads of its own."""
    with warnings.catch_warnings():
        if not verbose():
            warnings.filterwarnings("ignore", message=FORK_WARNING, category=RuntimeWarning)
        yield
