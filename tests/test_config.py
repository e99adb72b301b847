"""The config base (`sparqrl.algos.config`) and the shared validators (`sparqrl.config`): every field is
documented where it is declared, the shared fields once, and every int field refuses floats and bools."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from sparqrl import config as cfg
from sparqrl.algos import ALGORITHMS, get_algorithm
from sparqrl.algos.config import ActorCriticConfig, AdamConfig, AlgoConfig
from sparqrl.envs import make_env
from sparqrl.meta.mfos import MfosConfig
from sparqrl.meta.run import MetaConfig

ENVS = {"ppo": "CartPole-v1", "dqn": "CartPole-v1", "impala": "CartPole-v1", "td3": "Pendulum-v1",
        "sac": "Pendulum-v1", "a2c": "CartPole-v1",
        "a3c": "CartPole-v1"}
BASES = (AlgoConfig, AdamConfig, ActorCriticConfig)


def documented_by(cls: type) -> dict[str, list[type]]:
    """Field name -> the classes of `cls`'s MRO that declare it with a string literal right below it (the
    docstring tyro shows as CLI help)."""
    out: dict[str, list[type]] = {}
    for klass in cls.__mro__[:-1]:
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                out.setdefault(stmt.target.id, []).append(klass)
    return out


@pytest.mark.parametrize("cls", [get_algorithm(name).Config for name in ALGORITHMS] + [MfosConfig, MetaConfig],
                         ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_config_field_has_a_docstring(cls):
    documented = documented_by(cls)
    assert [f.name for f in dataclasses.fields(cls) if f.name not in documented] == []


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_shared_fields_are_documented_once_in_the_base(algo):
    """An algorithm redeclares a shared field only for its default: the docstring lives in the base alone."""
    cls = get_algorithm(algo).Config
    documented = documented_by(cls)
    shared = {f.name for base in BASES if issubclass(cls, base) for f in dataclasses.fields(base)}
    assert {name: [c.__name__ for c in documented[name]] for name in shared if name in documented
            and (len(documented[name]) != 1 or documented[name][0] not in BASES)} == {}
    assert {"total_timesteps", "num_envs", "gamma", "hidden", "activation"} <= set(documented)


def int_fields(cls: type) -> list[str]:
    hints = cfg.field_types(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] in (int, int | None)]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
@pytest.mark.parametrize("bad", [2.5, True])
def test_every_int_field_refuses_floats_and_bools(algo, bad):
    """One rule (`sparqrl.config.is_int`) for every int field: DQN's num_envs=2.5 is refused like PPO's."""
    module = get_algorithm(algo)
    env = make_env(ENVS[algo])
    names = int_fields(module.Config)
    assert {"total_timesteps", "num_envs"} <= set(names)
    for name in names:
        config = dataclasses.replace(module.Config(), **{name: bad})
        with pytest.raises(cfg.ConfigError, match=rf"^{name}={bad!r} is not allowed: must be an integer$"):
            config.validate(env)


@pytest.mark.parametrize("name", int_fields(MfosConfig))
def test_mfos_int_fields_refuse_floats_and_bools(name):
    for bad in (2.5, True):
        with pytest.raises(cfg.ConfigError, match=rf"^{name}={bad!r} is not allowed: must be an integer$"):
            MfosConfig(**{name: bad}).validate()


@pytest.mark.parametrize("value, ok", [(3, True), (0, True), (-2, True), (2.0, False), (True, False), ("3", False),
                                       (None, False)])
def test_is_int(value, ok):
    assert cfg.is_int(value) is ok


@pytest.mark.parametrize("kwargs, message", [
    (dict(value=1.5, low=0, high=1), "must be in [0, 1]"),
    (dict(value=1.0, low=0, high=1, open_high=True), "must be in [0, 1)"),
    (dict(value=0.0, low=0, high=1, open_low=True), "must be in (0, 1]"),
    (dict(value=-0.5, low=0), "must be >= 0"),
    (dict(value=0.0, low=0, open_low=True), "must be > 0"),
    (dict(value=3.0, high=2.5), "must be <= 2.5"),
])
def test_in_range_names_the_interval(kwargs, message):
    with pytest.raises(cfg.ConfigError) as excinfo:
        cfg.in_range("x", **kwargs)
    assert str(excinfo.value) == f"x={kwargs['value']!r} is not allowed: {message}"


@pytest.mark.parametrize("kwargs", [dict(value=1.0, low=0, high=1), dict(value=0.0, low=0), dict(value=0.5, low=0,
                                    high=1, open_low=True, open_high=True), dict(value=2.5, high=2.5)])
def test_in_range_accepts_the_ends_it_closes(kwargs):
    cfg.in_range("x", **kwargs)


def test_positive_int():
    cfg.positive_int("n", 1)
    for bad, message in ((0, "must be > 0"), (1.0, "must be an integer"), (False, "must be an integer")):
        with pytest.raises(cfg.ConfigError, match=rf"^n={bad!r} is not allowed: {message}$"):
            cfg.positive_int("n", bad)
