import os

import pytest

from sparqrl import devices


def test_seeds_are_spread_over_as_many_cores_as_divide_them():
    assert devices.cpu_devices_for(1, 2) == 1  # a 1-seed run is never slowed
    assert devices.cpu_devices_for(2, 2) == 2
    assert devices.cpu_devices_for(8, 2) == 2
    assert devices.cpu_devices_for(64, 16) == 16
    assert devices.cpu_devices_for(24, 16) == 12
    assert devices.cpu_devices_for(63, 2) == 1  # no device count divides 63 seeds under 2 cores
    assert devices.cpu_devices_for(64, 1) == 1


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        (["train", "ppo", "--seeds", "64"], {}, "=2"),
        (["train", "ppo", "--seeds=64"], {}, "=2"),
        (["train", "ppo", "--set", "seeds=64"], {}, "=2"),
        (["train", "ppo", "--seeds", "1"], {}, None),
        (["train", "ppo"], {}, None),
        (["train", "ppo", "--seeds", "64", "--env", "gym:CartPole-v1"], {}, None),
        (["train", "ppo", "--seeds", "64"], {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, "=1"),
        (["train", "ppo", "--seeds", "64"], {"JAX_PLATFORMS": "cuda"}, None),
        (["train", "ppo", "--seeds", "many"], {}, None),
        (["eval", "runs/a"], {}, None),
        (["sweep", "ppo", "--grid", "lr=1e-3,3e-4"], {}, "=2"),  # 2 settings x 1 seed
        (["sweep", "ppo", "--grid", "lr=1e-3,3e-4", "--workers", "2"], {}, None),  # spread over Ray workers
        (["meta", "lpo"], {}, "=2"),  # the default population, 32
        (["meta", "lpo", "--popsize", "4", "--seeds", "1"], {}, "=2"),
        (["meta", "lpo", "--popsize=1", "--set", "popsize=4"], {}, None),  # --set items are the inner config's
        (["meta", "mfos", "--trainer", "ppo"], {}, None),  # one learner
        (["meta", "lpo", "--ray-address", "127.0.0.1:6379"], {}, None),
    ],
)
def test_the_command_decides_before_jax_is_imported(monkeypatch, argv, env, expected):
    for name in ("XLA_FLAGS", "JAX_PLATFORMS", devices.CHOICE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    devices.spread_seeds(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if expected is None:
        assert devices.FLAG not in flags
    else:
        assert f"{devices.FLAG}{expected}" in flags
    assert (devices.CHOICE_ENV in os.environ) == (expected == "=2")
    if expected == "=2" and argv[:3] == ["train", "ppo", "--seeds"]:
        assert devices.seed_spread(2) == "2 CPU devices (auto: 64 seeds over 2 cores)"


def test_a_resumed_meta_run_is_spread_by_its_population(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text('{"meta": {"env": "CartPole-v1", "popsize": 6, "trainer": "es"}}')
    for name in ("XLA_FLAGS", "JAX_PLATFORMS", devices.CHOICE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    devices.spread_seeds(["meta", "--resume", str(tmp_path)])
    assert os.environ["XLA_FLAGS"] == f"{devices.FLAG}=3"
    assert devices.seed_spread(3) == "3 CPU devices (auto: 6 population members over 4 cores)"


def test_the_meta_default_population_is_the_configs():
    from sparqrl.meta.config import MetaConfig

    assert devices.META_POPSIZE == MetaConfig.popsize
