"""Issue 34 item 2: quiet by default. Third-party notices that tell a user nothing are filtered where they
arise (`sparqrl.quiet`); `--verbose` shows them."""

import subprocess
import warnings

import jax
import pytest

from sparqrl import cli, quiet
from sparqrl.extras import available


@pytest.fixture
def not_verbose(monkeypatch):
    monkeypatch.setenv(quiet.VERBOSE_ENV, "0")  # (and restored after the test: --verbose sets it)


def forks_warned() -> list[str]:
    """JAX's fork warnings while a subprocess starts inside `quiet.exec_forks` (a preexec_fn: Python forks
    and runs its at-fork hooks, as for Ray's processes)."""
    jax.devices()  # JAX installs its at-fork warning with its backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet.exec_forks():
            subprocess.run(["true"], preexec_fn=lambda: None, check=True)
    return [str(w.message) for w in caught if "os.fork" in str(w.message)]


def test_the_fork_warning_is_filtered_where_ray_forks(not_verbose):
    assert forks_warned() == []


def test_verbose_shows_the_fork_warning(not_verbose):
    assert cli._take_verbose(["ppo", "--verbose", "--seeds", "2"]) == ["ppo", "--seeds", "2"]
    assert quiet.verbose() and forks_warned()


@pytest.mark.skipif(not available("mujoco"), reason="needs the mujoco extra")
@pytest.mark.parametrize("verbose", [False, True])
def test_mujocos_deprecation_lines_only_when_verbose(capfd, monkeypatch, tmp_path, verbose):
    from sparqrl.envs.gym_env import _make

    monkeypatch.setenv(quiet.VERBOSE_ENV, "1" if verbose else "0")
    monkeypatch.chdir(tmp_path)
    _make("gym:HalfCheetah-v5").close()
    said = capfd.readouterr()
    assert ("settotalmass" in said.err) == verbose and "settotalmass" not in said.out
    assert list(tmp_path.iterdir()) == []  # no MUJOCO_LOG.TXT in the working directory
