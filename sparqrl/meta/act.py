"""ACT, adversarial cheap talk (Lu, Willi, Letcher, Foerster, ICML 2023; reference `meta_mfos_act.md` §3).

An adversary may only append a bounded message, scale * tanh(adversary(obs)), to a victim's observation
(`sparqrl.envs.cheap_talk.CheapTalk`); it is evolved over a population of PPO victims, each trained from
scratch inside the fitness function (one compiled program per generation, population x seeds vmapped):

  anti   fitness = -(the victim's return): the message wrecks its training
  pro    fitness = +(the victim's return): the message helps it
  goal   fitness = the mean goal reward exp(-(x - goal)^2) the victim collects while it trains on
         CartPole's own reward; the adversary also sees the goal (ACT's GEN, goal CartPole)

The victim's return is its mean episode return over the whole training ('lifetime', the reference's
default) or over its last 10 % of updates ('final', the reference's --end-only). On CartPole-v1 the victim
is ACT's: the 200-step CartPole (`act_cartpole`), 4 envs x 256 steps x 32 updates, 16 full-batch epochs,
lr 5e-3, 32-32 tanh (§3.2); elsewhere PPO's defaults. The genome starts at zero (the reference's OpenES
mean, so the first message is tanh(0) = 0).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM, make_train_fn
from sparqrl.envs import cheap_talk
from sparqrl.envs.wrappers import EpisodeStats
from sparqrl.meta.tasks import FITNESS, MetaTask, final_return, lifetime_return

MODES = ("anti", "pro", "goal")
SCALE = 2 * math.pi
"""The message's bound at train time (`CT_SCALE` of the reference's main_train_time.py)."""
CARTPOLE = "CartPole-v1"
VICTIM_CARTPOLE = {
    "num_envs": 4, "num_steps": 256, "total_timesteps": 32 * 4 * 256, "update_epochs": 16, "num_minibatches": 1,
    "lr": 5e-3, "anneal_lr": False, "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01, "vf_coef": 0.5,
    "clip_eps": 0.2, "max_grad_norm": 0.5, "hidden": (32, 32), "activation": "tanh",
}
"""ACT's CartPole victim (§3.2): the fields of `ppo.Config` it sets; the rest are PPO's defaults."""
FINAL_SEEDS = 8
"""Victims trained with the final adversary and with a silent one for summary.json."""


def victim_defaults(env_name: str) -> dict[str, Any]:
    return dict(VICTIM_CARTPOLE) if env_name == CARTPOLE else {}


def base_env(env_name: str, mode: str) -> Any:
    """The victim's environment before the cheap talk: ACT's 200-step CartPole (goal: its goal variant) for
    CartPole-v1, else the named on-device env as it is."""
    cfg.one_of("mode", mode, MODES)
    if mode == "goal":
        cfg.require(env_name == CARTPOLE, "env", env_name, "mode goal runs on CartPole-v1 (ACT's goal CartPole)")
        return cheap_talk.goal_cartpole()
    if env_name == CARTPOLE:
        return cheap_talk.act_cartpole()
    from sparqrl.envs import make_env
    from sparqrl.envs.core import is_host_env

    cfg.require(not is_host_env(env_name), "env", env_name, "act trains its victims on device: a gymnax or brax env")
    return make_env(env_name).env  # without its EpisodeStats: the cheap talk goes inside them


def make_task(env_name: str, mode: str, adversary: str, n_dims: int, victim: Any, fitness: str) -> MetaTask:
    """The meta task 'act': genome = the adversary's parameters (zeros), fitness by `mode` (module doc)."""
    from sparqrl.algos import ppo

    cfg.one_of("fitness", fitness, FITNESS)
    cfg.one_of("adversary", adversary, cheap_talk.KINDS)
    env = base_env(env_name, mode)
    zero = cheap_talk.zero_adversary(cheap_talk.adversary_obs_dim(env), n_dims, adversary)

    def wrapped(params: Any) -> Any:
        return EpisodeStats(cheap_talk.CheapTalk(env, params, n_dims=n_dims, scale=SCALE, kind=adversary))

    victim = victim.validate(wrapped(zero))
    ppo.make_algorithm(victim, wrapped(zero))  # host checks of the victim, before anything is traced

    def train(params: Any, key: jax.Array) -> dict[str, jax.Array]:
        _, metrics = make_train_fn(ppo.make_algorithm(victim, wrapped(params)))(key)
        return metrics

    def fitness_fn(genome: Any, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        metrics = train(genome, key)
        scores = {"lifetime_return": lifetime_return(metrics), "final_return": final_return(metrics)}
        if mode == "goal":
            scores["goal_reward"] = jnp.mean(metrics["goal_reward"])
            return scores["goal_reward"], scores
        sign = -1.0 if mode == "anti" else 1.0
        return sign * scores[f"{fitness}_return"], scores

    columns = ("lifetime_return", "final_return") + (("goal_reward",) if mode == "goal" else ())
    return MetaTask(name="act", init=lambda key: zero, fitness=fitness_fn,
                    env_steps=victim.num_updates * victim.batch_size, algo="ppo", inner_config=victim,
                    columns=columns, final_evaluation=final_evaluation(train, zero, columns))


def final_evaluation(train: Callable[[Any, jax.Array], dict[str, jax.Array]], zero: Any, columns: tuple[str, ...]
                     ) -> Callable[[Any, jax.Array], dict[str, Any]]:
    """centre -> summary entries: FINAL_SEEDS victims trained with the evolved adversary and, on the same
    keys, with a silent one (message 0): each column's mean over them, `victim_*` and `baseline_*`, and
    both mean learning curves (mean episode return per update)."""

    def scores(params: Any, keys: jax.Array) -> dict[str, jax.Array]:
        def one(key: jax.Array) -> dict[str, jax.Array]:
            metrics = train(params, key)
            out = {"lifetime_return": lifetime_return(metrics), "final_return": final_return(metrics),
                   "curve": metrics[EPISODE_RETURN_SUM] / jnp.maximum(metrics[EPISODE_COUNT], 1.0)}
            if "goal_reward" in columns:
                out["goal_reward"] = jnp.mean(metrics["goal_reward"])
            return out

        return jax.vmap(one)(keys)

    run = jax.jit(scores)

    def evaluate(center: Any, key: jax.Array) -> dict[str, Any]:
        keys = jax.random.split(key, FINAL_SEEDS)
        found, silent = jax.device_get((run(center, keys), run(zero, keys)))
        out: dict[str, Any] = {"final_evaluation_seeds": FINAL_SEEDS}
        for name in columns:
            out[f"victim_{name}_mean"] = float(np.nanmean(found[name]))
            out[f"baseline_{name}_mean"] = float(np.nanmean(silent[name]))
        # mean episode return per update (over the seeds), for learned.png
        out["victim_return_per_update"] = [round(float(x), 3) for x in found["curve"].mean(axis=0)]
        out["baseline_return_per_update"] = [round(float(x), 3) for x in silent["curve"].mean(axis=0)]
        return out

    return evaluate

