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
is ACT's: the 200-step CartPole (`act_cartpole`), 16 full-batch epochs, lr 5e-3, 32-32 tanh (§3.2), on 4 envs
x 128 steps x 16 updates by default (`victim` cpu: the documented CPU results') or ACT's 4 x 256 x 32 (paper);
elsewhere PPO's defaults. The genome starts at zero (the reference's OpenES mean, so the first message is
tanh(0) = 0).

At test time a fresh victim trains against a run's evolved adversary, held fixed, with the normal training
runner: the environment `act:DIR` (DIR an act meta run's folder) is the meta task's victim env with the
adversary of DIR/best_meta_params.npz, `act:DIR:silent` the same env with a silent one (message 0), and
`sparqrl train ppo --load-config DIR` trains ACT's victim config on `act:DIR`. A run records the name
resolved (`resolve_env_name`: 'act:/abs/DIR#sha256=HEX'), so resume, eval and stored compiled programs
rebuild exactly that adversary, or fail in one line if the folder changed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM, make_train_fn
from sparqrl.algos.ppo import objectives
from sparqrl.envs import EnvPrefix, cheap_talk
from sparqrl.envs.custom import module_of
from sparqrl.envs.wrappers import EpisodeStats
from sparqrl.meta.config import ACT_PREFIX, MetaConfig
from sparqrl.meta.tasks import FITNESS, MetaTask, final_return, lifetime_return

MODES = ("anti", "pro", "goal")
SCALE = 2 * math.pi
"""The message's bound at train time (`CT_SCALE` of the reference's main_train_time.py)."""
CARTPOLE = "CartPole-v1"
ACT_VICTIM = {
    "num_envs": 4, "num_steps": 256, "total_timesteps": 32 * 4 * 256, "update_epochs": 16, "num_minibatches": 1,
    "lr": 5e-3, "anneal_lr": False, "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01, "vf_coef": 0.5,
    "clip_eps": 0.2, "max_grad_norm": 0.5, "hidden": (32, 32), "activation": "tanh",
}
"""ACT's CartPole victim (§3.2): the fields of `ppo.Config` it sets; the rest are PPO's defaults."""
VICTIMS = {"cpu": {**ACT_VICTIM, "num_steps": 128, "total_timesteps": 16 * 4 * 128}, "paper": ACT_VICTIM}
"""The CartPole victims `MetaConfig.victim` names: cpu, ACT's on half its steps per update and half its updates
(8,192 env steps: every documented CPU result, where the silent victims end at 164-168 of 200 and leave a helpful
message room to show; benchmarks/history.md "Adversarial cheap talk on CartPole"), and paper, ACT's own."""
ES_DEFAULTS = {"seeds": 1, "sigma": 0.1, "lr": 0.05}
"""open_es's settings for what the command leaves unset: those ANTI and PRO met their goals with on a CPU
(population 32, 40 generations; BENCHMARKS.md, "Adversarial cheap talk"); the preset's sigma 0.04 / lr 0.01
moved nothing in 10 generations of 32."""


def victim_defaults(env_name: str, victim: str) -> dict[str, Any]:
    """The victim's `ppo.Config` fields the `victim` budget sets on `env_name` (CartPole-v1 only)."""
    cfg.one_of("victim", victim, tuple(VICTIMS))
    return dict(VICTIMS[victim]) if env_name == CARTPOLE else {}


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


def victim_env(env: Any, params: Any, n_dims: int, adversary: str) -> EpisodeStats:
    """What a victim trains on: `env` (`base_env`) with the message of the `adversary` kind's `params`
    (scale `SCALE`), episode statistics outside."""
    return EpisodeStats(cheap_talk.CheapTalk(env, params, n_dims=n_dims, scale=SCALE, kind=adversary))


def make_task(env_name: str, mode: str, adversary: str, n_dims: int, victim: Any, fitness: str,
              final_seeds: int) -> MetaTask:
    """The meta task 'act': genome = the adversary's parameters (zeros), fitness by `mode` (module doc); its
    final evaluation trains `final_seeds` victims per adversary."""
    from sparqrl.algos import ppo

    cfg.one_of("fitness", fitness, FITNESS)
    cfg.one_of("adversary", adversary, cheap_talk.KINDS)
    env = base_env(env_name, mode)
    zero = cheap_talk.zero_adversary(cheap_talk.adversary_obs_dim(env), n_dims, adversary)

    def wrapped(params: Any) -> Any:
        return victim_env(env, params, n_dims, adversary)

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
                    columns=columns, final_evaluation=final_evaluation(train, zero, columns, final_seeds))


def final_evaluation(train: Callable[[Any, jax.Array], dict[str, jax.Array]], zero: Any, columns: tuple[str, ...],
                     seeds: int) -> Callable[[Any, jax.Array], dict[str, Any]]:
    """centre -> summary entries: `seeds` victims trained with the evolved adversary and, on the same
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
        keys = jax.random.split(key, seeds)
        found, silent = jax.device_get((run(center, keys), run(zero, keys)))
        out: dict[str, Any] = {"final_evaluation_seeds": seeds}
        for name in columns:
            out[f"victim_{name}_mean"] = float(np.nanmean(found[name]))
            out[f"baseline_{name}_mean"] = float(np.nanmean(silent[name]))
        # mean episode return per update (over the seeds), for learned.png
        out["victim_return_per_update"] = [round(float(x), 3) for x in found["curve"].mean(axis=0)]
        out["baseline_return_per_update"] = [round(float(x), 3) for x in silent["curve"].mean(axis=0)]
        return out

    return evaluate


# --------------------------------------------------------------------------------------------------
# Test time: a fresh victim against a run's adversary, held fixed (`act:DIR` environments)
# --------------------------------------------------------------------------------------------------

SILENT = "silent"
"""Suffix of `act:DIR:silent`: the run's victim env with a silent adversary (zero parameters: message 0)."""
_DIGEST = "#sha256="
"""What separates a resolved name from the hash of what it builds (as in a learned rule's 'lpo:FILE#sha256=')."""
_NAMES = f"must be {ACT_PREFIX}DIR or {ACT_PREFIX}DIR:{SILENT}, DIR the folder of a `sparqrl meta act` run"


class FixedAdversary(NamedTuple):
    """What an `act:DIR[:silent]` env is built from: the act meta run's settings and its adversary."""

    meta: MetaConfig  # the run's settings: env, mode, adversary (the kind) and n_dims are read
    env: Any  # the victim's env before the cheap talk (`base_env` of the run's env and mode)
    params: Any  # the adversary's parameters: the run's best_meta_params.npz (the strategy's centre), or zeros

    @property
    def digest(self) -> str:
        """A hash of everything the env depends on (the settings and the parameters' content): 16 hex digits."""
        setting = f"{self.meta.env} {self.meta.mode} {self.meta.adversary} {self.meta.n_dims} "
        return hashlib.sha256((setting + objectives.params_digest(self.params)).encode()).hexdigest()[:16]

    def victim_env(self) -> EpisodeStats:
        """The env the meta task's victims train on, with this adversary (`victim_env`)."""
        return victim_env(self.env, self.params, self.meta.n_dims, self.meta.adversary)


def parse_env_name(name: str) -> tuple[str, bool, str | None]:
    """'act:DIR[:silent][#sha256=HEX]' -> (DIR, silent, HEX or None). A last ':' part is a suffix unless
    the whole of it names a folder; a suffix other than ':silent', or no DIR, is a one-line ConfigError."""
    rest, sep, digest = name.removeprefix(ACT_PREFIX).rpartition(_DIGEST)
    if not sep:
        rest, digest = digest, None
    folder, colon, suffix = rest.rpartition(":")
    if not colon or os.path.isdir(os.path.expanduser(rest)):
        folder, suffix = rest, ""
    cfg.require(suffix in ("", SILENT), "env", name, f"{_NAMES} (no other suffix than :{SILENT})")
    cfg.require(bool(folder), "env", name, _NAMES)
    return folder, suffix == SILENT, digest


def _what_is_there(data: Any) -> str:
    """What a folder's config.json says the folder holds, for an error."""
    from sparqrl.runners.rundir import is_meta_config

    if is_meta_config(data) and isinstance(data["meta"], dict):
        return f"a `sparqrl meta {data['meta'].get('task')}` run's folder"
    if isinstance(data, dict) and "algo" in data:
        return f"a {data['algo']} train or sweep run's folder"
    return "not a sparqrl run's folder"


def read_meta_config(run_dir: str, name: str) -> MetaConfig:
    """The MetaConfig of the act meta run in `run_dir`; a one-line ConfigError naming env=`name` when the
    folder is missing, is no act meta run, or holds a damaged config.json."""
    from sparqrl.runners.rundir import CONFIG, is_meta_config

    folder = Path(run_dir).expanduser()
    cfg.require(folder.is_dir(), "env", name, f"{_NAMES} (no such folder: {run_dir})")
    cfg.require((folder / CONFIG).is_file(), "env", name, f"{_NAMES} ({run_dir} has no {CONFIG}: not a sparqrl run)")
    try:
        data = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as error:
        cfg.fail("env", name, f"{_NAMES} ({run_dir} holds a damaged {CONFIG}: {type(error).__name__}: {error})")
    meta = data["meta"] if is_meta_config(data) else None
    is_act = isinstance(meta, dict) and meta.get("task") == "act"
    cfg.require(is_act, "env", name, f"{_NAMES} ({run_dir} is {_what_is_there(data)})")
    try:
        config = cfg.from_dict(MetaConfig, meta)
    except (KeyError, TypeError, ValueError) as error:
        cfg.fail("env", name, f"{_NAMES} ({run_dir} holds a damaged {CONFIG}: {type(error).__name__}: {error})")
    # a run folder is data, never code (`sparqrl.trust`): the victim env it names is one of sparqrl's own
    cfg.require(module_of(config.env) is None, "env", name, f"{_NAMES}: {folder / CONFIG} names the victim env "
                f"{config.env!r}, a module's: an act:DIR env is built on sparqrl's own envs only (a gymnax id or "
                "brax:NAME), never on a module a run folder names")
    return config


def read_fixed_adversary(run_dir: str, silent: bool = False, name: str | None = None) -> FixedAdversary:
    """The act meta run in `run_dir` and its adversary (`silent`: zero parameters instead, the file not
    read). One-line ConfigErrors naming env=`name` (default 'act:RUN_DIR') for a folder that is no act meta
    run or a best_meta_params.npz that is missing, unreadable or of other shapes."""
    name = f"{ACT_PREFIX}{run_dir}" if name is None else name
    meta = read_meta_config(run_dir, name)
    env = base_env(meta.env, meta.mode)
    zero = cheap_talk.zero_adversary(cheap_talk.adversary_obs_dim(env), meta.n_dims, meta.adversary)
    if silent:
        return FixedAdversary(meta, env, zero)
    try:
        params = objectives.load_meta_params(Path(run_dir).expanduser(), zero)
    except cfg.ConfigError as error:
        raise cfg.ConfigError(f"env={name!r}: {error} (the adversary an act meta run saves after each generation)"
                              ) from None
    return FixedAdversary(meta, env, params)


def open_env_name(name: str) -> FixedAdversary:
    """What the env name 'act:DIR[:silent][#sha256=HEX]' builds; a recorded hash must still be that of the
    folder's settings and adversary (one-line ConfigError when the folder changed since)."""
    run_dir, silent, digest = parse_env_name(name)
    adversary = read_fixed_adversary(run_dir, silent, name)
    cfg.require(digest is None or digest == adversary.digest, "env", name,
                f"the act run's adversary or settings changed since this name was recorded (they now hash to "
                f"{adversary.digest}): start a new run to train against them")
    return adversary


def env_from_name(name: str) -> EpisodeStats:
    """The device env an 'act:...' name builds (`sparqrl.envs.make_env`)."""
    return open_env_name(name).victim_env()


def resolve_env_name(name: str) -> str:
    """'act:DIR[:silent]' as a run records it: 'act:/abs/DIR[:silent]#sha256=HEX', HEX the hash of what
    it builds, so a resume from another folder, an eval and the stored compiled programs (keyed by the
    env's name) rebuild exactly this adversary. Checks the folder (one-line ConfigErrors)."""
    run_dir, silent, _ = parse_env_name(name)
    digest = open_env_name(name).digest
    suffix = f":{SILENT}" if silent else ""
    return f"{ACT_PREFIX}{os.path.abspath(os.path.expanduser(run_dir))}{suffix}{_DIGEST}{digest}"


OPENER = EnvPrefix(check=open_env_name, make=env_from_name, resolve=resolve_env_name)
"""How `act:` env names are opened (`sparqrl.meta.prefix` registers it with `sparqrl.envs`)."""
