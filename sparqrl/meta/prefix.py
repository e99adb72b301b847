"""The env-name prefix meta owns, `act:DIR` (an ACT run's victim env with its adversary held fixed), registered
with `sparqrl.envs` by importing this module, as the entry points (`sparqrl.cli`, `sparqrl.api`) do. What opens
such a name, `sparqrl.meta.act` (JAX, the run's files), loads at the first one, not at the command's start."""

from __future__ import annotations

from sparqrl.envs import EnvPrefix, register_prefix
from sparqrl.meta.config import ACT_PREFIX


def _act_opener() -> EnvPrefix:
    from sparqrl.meta import act

    return act.OPENER


register_prefix(ACT_PREFIX, _act_opener)
