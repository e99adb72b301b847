"""Issue 34 item 6: a line wherever a wait passes ~5 s. Before the training programs compile (only where the
cache does not hold them) and before meta's final evaluation; nothing with progress off. (The video's lines:
tests/test_video.py.)"""

import sparqrl
from sparqrl.meta import run as meta_run

TINY = dict(steps=256, chunks=1, num_envs=2, num_steps=32, hidden=(8,), energy=False, eval_episodes=1)
COMPILING = "sparqrl: compiling the training program for CartPole-v1 (first time for this configuration; later " \
            "runs load it from the cache)"


def compiling_lines(capsys, tmp_path, cache: str, progress: bool) -> list[str]:
    """The compile lines of a tiny PPO run whose cache is `tmp_path/cache`."""
    sparqrl.train("ppo", "CartPole-v1", out=tmp_path / f"run-{cache}-{progress}", progress=progress, **TINY)
    return [line for line in capsys.readouterr().err.splitlines() if "compiling" in line]


def test_compiling_is_said_once_and_only_where_the_cache_does_not_hold_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "quiet"))
    assert compiling_lines(capsys, tmp_path, "quiet", progress=False) == []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cold"))
    assert compiling_lines(capsys, tmp_path, "cold", progress=True) == [COMPILING]
    assert compiling_lines(capsys, tmp_path, "warm", progress=True) == []  # the same cache, now holding it


def test_meta_says_its_final_evaluation_starts(capsys, tmp_path):
    config = meta_run.MetaConfig(task="mfos", popsize=4, games=8, generations=1, out=str(tmp_path / "m"),
                                 energy=False, progress=True)
    meta_run.train_meta(config)
    lines = capsys.readouterr().err.splitlines()
    assert "sparqrl: final evaluation of the evolved centre (mfos): compiling and running it" in lines


def test_the_host_runner_says_its_learner_compiles(capsys, tmp_path):
    """The actor-learner runner compiles its learner at the start and at the first fragment (a CNN's: tens of
    seconds on a CPU): one line before, none with progress off."""
    host = dict(steps=300, seeds=1, energy=False, learning_starts=100, batch_size=16, hidden=(8,), fragment_steps=4,
                chunks=1, eval_episodes=1)
    for progress in (False, True):
        sparqrl.train("dqn", "gym:CartPole-v1", out=tmp_path / f"host-{progress}", progress=progress, **host)
        lines = [line for line in capsys.readouterr().err.splitlines() if "compiling" in line]
        assert lines == ([f"sparqrl: compiling the learner for gym:CartPole-v1 (later runs of this configuration load "
                          "it from the compile cache)"] if progress else []), lines
