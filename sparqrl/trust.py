"""A run folder is data, never code (docs/security.md).

Run folders are shared: a colleague's checkpoint, a paper's artefact. What a folder's config.json (or a
`--load-config` file) names is therefore used only when the user names the same thing on the command
that opens it: a module to import (a run's `imports`, the module of a `gym:MODULE:ATTR` /
`jax:MODULE:ATTR` env), a Ray address to join (`ray_address`) and W&B's online mode (`wandb_mode`, which sends
the run off the machine). `Trust` is what the command named;
`require_trusted` is the one check, made by every function that opens a folder before anything is
imported, resolved or joined. A user's own torso (`network=MODULE:ATTR`, `sparqrl.nets.torso`) is such a
module. No module is exempt: a folder naming `gym:os:fork` is refused like any other.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

from sparqrl.config import ConfigError, reference_module
from sparqrl.envs.custom import module_of


@dataclasses.dataclass(frozen=True)
class Trust:
    """What the user named on the command that opens a folder."""

    modules: frozenset[str] = frozenset()
    """Modules the command names: `--import MODULE`, and the module of its `--env gym:/jax:MODULE:ATTR`."""
    addresses: frozenset[str] = frozenset()
    """Ray addresses the command names (`--ray-address`)."""
    uploads: bool = False
    """Whether the command names `--wandb-mode online` (a resumed run may then upload to W&B as it goes)."""
    everything: bool = False
    """`trust_imports=True` from Python: the folder's own names are used."""
    python: bool = False
    """Whether the user allows more with `trust_imports=True` (Python) rather than with flags (the CLI)."""


def named(imports: Iterable[str] = (), env: str | None = None, ray_address: str | None = None,
          python: bool = False, everything: bool = False, wandb_mode: str | None = None) -> Trust:
    """The trust of a command (or call) that names these modules, this env, this address and W&B mode."""
    modules = {m for m in imports if isinstance(m, str)} | ({module_of(env)} - {None})
    return Trust(frozenset(modules), frozenset({ray_address} - {None}), everything=everything, python=python,
                 uploads=wandb_mode == "online")


NOTHING = Trust()
"""A command that names nothing: a folder's modules and address are refused."""


def require_trusted(trust: Trust, source: Path | str, imports: Iterable[str] = (), env: str | None = None,
                    ray_address: str | None = None, uploads: bool = False,
                    networks: Iterable[tuple[str, str]] = ()) -> None:
    """Raise a one-line `ConfigError` for the first module or address that `source` (a config.json) names
    and the command did not: which one, from which file, and the flag that allows it. networks: (field,
    MODULE:ATTR) of the torsos its algorithm config names (`AlgoConfig.network_references`)."""
    if trust.everything:
        return
    wanted = [("imports", m, m) for m in imports] + ([("env", env, module_of(env))] if module_of(env) else [])
    wanted += [(field, spec, reference_module(spec)) for field, spec in networks]
    for field, value, module in wanted:
        if module not in trust.modules:
            allow = "pass trust_imports=True" if trust.python else f"add --import {module}"
            raise ConfigError(f"{field}={value!r} in {source} needs module {module!r}, and a run folder is data, "
                              f"never code: sparqrl imports it only when you name it ({allow}, if you trust "
                              "that module)")
    if ray_address is not None and ray_address not in trust.addresses:
        allow = "pass trust_imports=True" if trust.python else f"add --ray-address {ray_address}"
        raise ConfigError(f"ray_address={ray_address!r} in {source}: a run folder never chooses where to connect; "
                          f"sparqrl joins that Ray cluster only when you name it ({allow})")
    if uploads and not trust.uploads:
        allow = "pass trust_imports=True" if trust.python else "add --wandb-mode online"
        raise ConfigError(f"wandb_mode='online' in {source}: a run folder never chooses to send the run off the "
                          f"machine; sparqrl uploads to W&B only when you name it ({allow})")
