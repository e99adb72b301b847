"""IMPALA configuration. Defaults for classic control: 8 envs x 20-step fragments (the paper's unroll), TF1's
RMSProp (the paper's: decay 0.99, epsilon 0.01) at 4e-3 annealed, entropy 0.003, global gradient clip 40 (the
paper's), one gradient step per fragment. Chosen by `sparqrl sweep impala --env CartPole-v1` over 16-64 seeds per
setting (BENCHMARKS.md, "Defaults on every seed"): the former clip 0.5 let the critic's large gradients (values
near 100) shrink every actor step, and entropy 0.01 outweighed the vanishing advantages once the policy reached
500, so a quarter of seeds collapsed. Adam (eps 1e-5) then still failed 9 of 576 seeds at 500k: after a long
stretch at 500 its second moments decay with the advantages, and the first fall's TD errors (near -100) became
steps of many times lr; RMSProp's epsilon inside the root bounds them: 0 of 512 (history.md, 2026-11-28 night)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from sparqrl.algos.config import RMSPropActorCriticConfig
from sparqrl.config import in_unit_interval, positive


@dataclasses.dataclass(frozen=True)
class Config(RMSPropActorCriticConfig):
    """IMPALA (Espeholt et al. 2018, arXiv 1802.01561): an actor-critic that learns from actors' fragments
    with V-trace's off-policy correction (`sparqrl.returns.vtrace`). A fragment is num_steps env steps of
    each environment (20: the paper's unroll), one gradient step each; on the host, longer fragments mean
    fewer policy versions for the actors to load."""

    # Traced inputs of the compiled program (`algos.base`): a sweep or population varies them in one program.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "gamma", "vtrace_lambda", "rho_bar", "c_bar", "ent_coef", "vf_coef",
                                         "max_grad_norm", "rmsprop_alpha", "rmsprop_eps")

    num_envs: int = 8
    num_steps: int = 20
    lr: float = 4e-3
    ent_coef: float = 0.003
    max_grad_norm: float = 40.0
    rmsprop_eps: float = 0.01  # the paper's (TF1's RMSProp: inside the root)

    vtrace_lambda: float = 1.0
    """V-trace's lambda: scales the traces c_t (1: the paper's V-trace; lower trades variance for bias)."""

    rho_bar: float = 1.0
    """Clip of the importance weights rho_t in the V-trace targets and the policy-gradient advantages (1: the
    paper's). Host envs start from 10 (`presets`, impala-host): actors' copies lag the learner there, and a clip
    at 1 biases the policy gradient toward the learner's own recent moves wherever the critic overestimates."""

    c_bar: float = 1.0
    """Clip of the trace coefficients c_t (the paper assumes rho_bar >= c_bar)."""

    @classmethod
    def upgrade_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """A saved config.json of an older sparqrl in today's fields (`config.from_dict`): one that holds every
        field but the optimizer's trained with Adam (eps 1e-5), and resumes with it; a partial file (--load-config)
        keeps today's defaults."""
        data = dict(data)
        new = {"optimizer", "rmsprop_alpha", "rmsprop_eps"}
        if new.isdisjoint(data) and {f.name for f in dataclasses.fields(cls)} - new <= set(data):
            data["optimizer"] = "adam"
        return data

    @property
    def env_steps_per_update(self) -> int:
        return self.batch_size

    def validate(self, env: Any) -> "Config":
        """Raise `ConfigError` for a bad value; runs on the host, before anything is traced."""
        self.check_fields()
        in_unit_interval("vtrace_lambda", self.vtrace_lambda)
        positive("rho_bar", self.rho_bar)
        positive("c_bar", self.c_bar)
        self.check_actions(env, "IMPALA")
        return self
