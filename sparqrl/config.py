"""Config helpers shared by every algorithm and runner.

Configs are frozen dataclasses whose fields carry a docstring right below them (the CLI shows it).
Every check happens on the host, before anything is traced or compiled, and a failure raises
`ConfigError` with one line that names the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import typing
from typing import Any, Mapping, TypeVar

C = TypeVar("C")


class ConfigError(ValueError):
    """A bad user-supplied value, reported before compilation."""


def fail(field: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"{field}={value!r} is not allowed: {allowed}")


def require(ok: bool, field: str, value: Any, allowed: str) -> None:
    """Raise a `ConfigError` naming `field`, `value` and `allowed` unless `ok`."""
    if not ok:
        fail(field, value, allowed)


def is_int(value: Any) -> bool:
    """An integer and not a bool: Python counts True as 1, a user never means a count by it. The one place
    this rule is spelled (numpy's integers pass: `numbers.Integral`)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number and not a bool (`numbers.Real`: Python's and numpy's ints and floats)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(field: str, value: Any) -> None:
    """`value` is an integer (`is_int`)."""
    require(is_int(value), field, value, "must be an integer")


def positive_int(field: str, value: Any) -> None:
    """A count, size or interval: an integer > 0."""
    integer(field, value)
    positive(field, value)


def check_ints(config: Any) -> None:
    """Every field declared `int` (or `int | None`, when not None) holds an integer (`is_int`): one rule
    for every count of every config, before its own range checks compare it."""
    hints = field_types(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if hints[f.name] is int or (typing.get_args(hints[f.name]) == (int, type(None)) and value is not None):
            integer(f.name, value)


def in_range(field: str, value: float, low: float | None = None, high: float | None = None, *,
             open_low: bool = False, open_high: bool = False) -> None:
    """`value` lies between `low` and `high` (None: no bound on that side), each end closed unless `open_*`;
    the message states the interval ('must be in [0, 1)', 'must be >= 0')."""
    above = low is None or (value > low if open_low else value >= low)
    below = high is None or (value < high if open_high else value <= high)
    if low is not None and high is not None:
        allowed = f"must be in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    elif low is not None:
        allowed = f"must be {'>' if open_low else '>='} {low:g}"
    else:
        allowed = f"must be {'<' if open_high else '<='} {high:g}"
    require(above and below, field, value, allowed)


def positive(field: str, value: float) -> None:
    in_range(field, value, 0, open_low=True)


def in_unit_interval(field: str, value: float, *, closed_right: bool = True) -> None:
    in_range(field, value, 0, 1, open_high=not closed_right)


INT32_MAX = 2**31 - 1


def auto(value: int | None, paper: int, cap: float) -> int:
    """A schedule length left to the default (None): the paper's value, at most `cap` (a fraction of the
    run's budget), so short runs keep the schedule's shape."""
    return value if value is not None else min(paper, int(cap))


def check_numbers(config: Any) -> None:
    """Every int (and tuple of ints) of a config dataclass fits the int32 the compiled program holds it
    in, and every float is finite: checked before any folder is written, so `--steps 1e20` or
    `--set lr=inf` is a one-line error instead of an overflow or a run of NaNs."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            if is_int(item):
                require(-INT32_MAX <= item <= INT32_MAX, f.name, value,
                        f"must fit a 32-bit integer (|value| <= {INT32_MAX:,})")
            elif isinstance(item, float):
                require(math.isfinite(item), f.name, value, "must be a finite number")


NAME_MAX = 255
"""Longest file or folder name, in bytes, that Linux, macOS and Windows file systems allow."""
PATH_MAX = 4096
"""Longest path, in bytes, that Linux's system calls take."""


def check_path(field: str, value: str) -> None:
    """`value` is a path the OS can create and every file of a run can record: UTF-8 text (a byte that is
    not arrives as a lone surrogate, which orbax, JSON and TensorBoard cannot write), no NUL, no name over
    NAME_MAX bytes. Checked before anything is written, so the OS never refuses it halfway through a run."""
    require(isinstance(value, str) and bool(value), field, value, "must be a path")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        fail(field, value, "must be valid UTF-8 text (the run records it; orbax and TensorBoard write only UTF-8 "
                           "paths)")
    require(b"\0" not in encoded, field, value, "must not contain a NUL character")
    longest = max(len(name) for name in encoded.split(b"/"))
    require(longest <= NAME_MAX, field, value, f"has a name of {longest} bytes; file systems allow {NAME_MAX}")
    require(len(encoded) < PATH_MAX, field, value, f"is {len(encoded)} bytes long; the OS takes paths under {PATH_MAX}")


def one_of(field: str, value: Any, choices: typing.Iterable[Any]) -> None:
    choices = list(choices)
    require(value in choices, field, value, f"must be one of {', '.join(map(str, choices))}")


FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr", "actor_lr", "critic_lr"), "policy_lr": ("actor_lr",), "q_lr": ("critic_lr",),
    "n_envs": ("num_envs",), "num_envs_per_worker": ("num_envs",), "num_envs_per_env_runner": ("num_envs",),
    "num_workers": ("actors",), "num_rollout_workers": ("actors",), "num_env_runners": ("actors",),
    "rollout_fragment_length": ("fragment_steps",), "n_steps": ("num_steps", "nstep"), "n_step": ("nstep",),
    "n_epochs": ("update_epochs",), "num_epochs": ("update_epochs",), "num_sgd_iter": ("update_epochs",),
    "lambda": ("gae_lambda", "vtrace_lambda"), "lambda_": ("gae_lambda", "vtrace_lambda"),
    "clip_range": ("clip_eps",), "clip_coef": ("clip_eps",), "clip_param": ("clip_eps",),
    "entropy_coeff": ("ent_coef",), "vf_loss_coeff": ("vf_coef",), "grad_clip": ("max_grad_norm",),
    "buffer_size": ("buffer_max_size",), "train_freq": ("train_interval",), "train_frequency": ("train_interval",),
    "target_network_frequency": ("target_update_interval",), "target_network_update_freq": ("target_update_interval",),
    "exploration_initial_eps": ("epsilon_start",), "start_e": ("epsilon_start",),
    "exploration_final_eps": ("epsilon_finish",), "end_e": ("epsilon_finish",), "double_q": ("double_dqn",),
    "num_steps_sampled_before_learning_starts": ("learning_starts",),
    "policy_frequency": ("policy_delay", "actor_update_interval"), "target_policy_noise": ("target_noise",),
    "policy_noise": ("target_noise",), "noise_clip": ("target_noise_clip",),
    "alpha": ("init_alpha", "priority_exponent"), "initial_alpha": ("init_alpha",), "ent_coef": ("init_alpha",),
    "autotune": ("learn_alpha",), "beta": ("importance_exponent",), "prioritized_replay_alpha": ("priority_exponent",),
    "prioritized_replay_beta": ("importance_exponent",), "prioritized_replay_eps": ("priority_epsilon",),
    "vtrace_clip_rho_threshold": ("rho_bar",), "net_arch": ("hidden",), "fcnet_hiddens": ("hidden",),
    "activation_fn": ("activation",), "fcnet_activation": ("activation",), "norm_obs": ("normalize_obs",),
    "norm_reward": ("normalize_reward",), "steps": ("total_timesteps",), "timesteps": ("total_timesteps",),
    "track": ("wandb",), "wandb_project_name": ("wandb",), "wandb_project": ("wandb",),
}
"""What Stable-Baselines3, CleanRL and RLlib call a setting whose sparqrl name differs -> sparqrl's names for it,
in order (a config has the first of them it holds: SB3's `ent_coef` is PPO's own, SAC's `init_alpha`). Only for
'did you mean': a user who types another library's name learns ours; nothing accepts the other name."""


def aliases(name: str, names: typing.Iterable[str]) -> list[str]:
    """The `names` that `name` (another library's name of a setting, '-' or '_') stands for (FIELD_ALIASES)."""
    names = set(names)
    return [n for n in FIELD_ALIASES.get(name.lower().replace("-", "_"), ()) if n in names]


def close_matches(name: str, names: typing.Iterable[str]) -> str:
    """A short 'did you mean' phrase for an unknown `name`: sparqrl's own name(s) when `name` is another
    library's name of a setting (`aliases`), else the names spelled most alike."""
    names = list(names)
    known = aliases(name, names)
    if known:
        return f"; sparqrl calls it {' and '.join(known)}"
    matches = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    return f"; close matches: {', '.join(matches)}" if matches else ""


def close_flags(flag: str, flags: typing.Iterable[str]) -> str:
    """`close_matches` for a command-line flag: flags compared by their names alone (`--config.ent-coef` as
    `ent-coef`), since the dashes and prefix every flag shares would make any two look alike."""
    by_name: dict[str, str] = {}
    for known in sorted(flags, key=len):  # a name of two flags (`--sparse`, `--config.sparse`): the shorter
        by_name.setdefault(known.lstrip("-").rsplit(".", 1)[-1], known)
    matches = difflib.get_close_matches(flag.lstrip("-").rsplit(".", 1)[-1], list(by_name), n=4, cutoff=0.6)
    return f"; close matches: {', '.join(by_name[m] for m in matches)}" if matches else ""


def _convert(text: str, annotation: Any, field: str) -> Any:
    """Parse the string form of a `--set key=value` override into the field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:  # `X | None`: "none" is None, anything else an X
        if text.lower() == "none":
            return None
        return _convert(text, next(a for a in args if a is not type(None)), field)
    if annotation is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        fail(field, text, "must be a boolean (true/false)")
    if annotation in (int, float, str):
        try:
            value = annotation(float(text)) if annotation is int and "e" in text.lower() else annotation(text)
        except ValueError:
            fail(field, text, f"must be {annotation.__name__}")
        if annotation is int and str(value) != text and float(text) != value:
            fail(field, text, "must be an integer")
        return value
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        one_of(field, text, [str(c) for c in choices])
        return next(c for c in choices if str(c) == text)
    if origin is tuple:
        (elem, *_rest) = typing.get_args(annotation)
        parts = [p for p in text.strip("()[] ").split(",") if p.strip()]
        return tuple(_convert(p.strip(), elem, field) for p in parts)
    fail(field, text, f"cannot be set from the command line (type {annotation})")


def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def override(config: C, overrides: Mapping[str, str]) -> C:
    """Return `config` with string overrides applied (`--set key=value`); unknown keys are errors."""
    hints = field_types(type(config))
    names = [f.name for f in dataclasses.fields(config)]
    values = {}
    for key, text in overrides.items():
        if key not in names:
            raise ConfigError(
                f"unknown field {key!r} for {type(config).__name__}{close_matches(key, names)}"
            )
        values[key] = _convert(text, hints[key], key)
    return dataclasses.replace(config, **values)


def parse_set(items: typing.Iterable[str]) -> dict[str, str]:
    """Split `key=value` strings; a malformed item is an error."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        require(bool(sep) and bool(key), "--set", item, "must look like key=value")
        out[key.strip()] = value.strip()
    return out


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type[C], data: Mapping[str, Any], source: str = "") -> C:
    """The config `data` (parsed JSON: a run's config.json, a --load-config file) describes. Every key must be
    a field and every value of its field's type, else a one-line ConfigError naming `source` (the file), the
    field and the type: a file is data from anywhere, and `lr: "abc"` or `imports: "x"` (a string split into
    characters) must not reach the run."""
    where = f"{source}: " if source else ""
    require(isinstance(data, Mapping), f"{where}{cls.__name__}", data, "must be a JSON object of fields")
    upgrade = getattr(cls, "upgrade_dict", None)  # a config class may map fields an older sparqrl saved
    if upgrade is not None:
        data = upgrade(data)
    hints = field_types(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        require(key in names, f"{where}{key}", value, f"is not a field of {cls.__name__}{close_matches(key, names)}")
        values[key] = _from_json(value, hints[key], f"{where}{key}")
    return cls(**values)


def _from_json(value: Any, annotation: Any, field: str) -> Any:
    """`value` (parsed JSON) as the type `annotation` (the config field types: bool, int, float, str,
    Literal, `X | None`, `tuple[X, ...]`), else a ConfigError naming `field`."""
    args = typing.get_args(annotation)
    if type(None) in args:
        return None if value is None else _from_json(value, next(a for a in args if a is not type(None)), field)
    if typing.get_origin(annotation) is tuple:
        require(isinstance(value, (list, tuple)), field, value, f"must be a list, each item {_kind(args[0])}")
        return tuple(_from_json(item, args[0], field) for item in value)
    if typing.get_origin(annotation) is typing.Literal:
        one_of(field, value, args)
        return value
    ok = {bool: isinstance(value, bool), int: is_int(value), float: is_number(value),
          str: isinstance(value, str)}.get(annotation, True)
    require(ok, field, value, f"must be {_kind(annotation)}")
    return float(value) if annotation is float else value


def _kind(annotation: Any) -> str:
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}.get(
        annotation, str(annotation))


def dumps(config: Any) -> str:
    return json.dumps(to_dict(config), indent=2, sort_keys=True)


REFERENCE_FORM = "MODULE:ATTR, ATTR a zero-argument callable (e.g. a flax Module class) at the top level of an importable module"
"""How a config names code by reference (a user's own torso, `sparqrl.nets.torso`): never an object, never pickled."""


def reference_module(spec: Any) -> str | None:
    """The module a MODULE:ATTR reference imports; None for anything else (None: nothing named)."""
    if not isinstance(spec, str):
        return None
    module, sep, attr = spec.partition(":")
    return module if sep and module and attr else None


def check_reference(field: str, spec: Any) -> None:
    """`spec` is None or a MODULE:ATTR reference (dotted identifiers on both sides); nothing is imported."""
    if spec is None:
        return
    module = reference_module(spec)
    attr = spec.partition(":")[2] if module is not None else ""
    require(module is not None and all(p.isidentifier() for p in module.split(".") + attr.split(".")),
            field, spec, f"must be {REFERENCE_FORM}")
