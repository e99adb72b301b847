"""The settings of a meta run (`sparqrl meta TASK`), apart from the run itself (`sparqrl.meta.run`), so that
what reads a meta run's folder (`sparqrl.meta.act`: an `act:DIR` env) needs neither the run nor evosax."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

DEFAULT_ENV = "CartPole-v1"
ACT_PREFIX = "act:"
"""Names of ACT victim envs start with this: `act:DIR[:silent]` (opened by `sparqrl.meta.act`, registered with
`sparqrl.envs` by `sparqrl.meta.prefix`)."""
ACT_FINAL_SEEDS_BEFORE = 8
"""The final evaluation's victims per side of an act run saved before `final_seeds` was a setting."""
ACT_VICTIM_BEFORE = "paper"
"""The CartPole victim of an act run saved before `victim` was a setting: ACT's own (`sparqrl.meta.act`)."""
DEFAULT_GENERATIONS = 16
"""Generations where the task has no number of its own (`TASK_GENERATIONS`)."""
TASK_GENERATIONS = {"act": 40}
"""Generations of the tasks whose documented results were reached with another number: act's 40 generations of 32
(docs/meta-evolution.md, benchmarks/history.md "Adversarial cheap talk on CartPole")."""


@dataclasses.dataclass(frozen=True)
class MetaConfig:
    """`sparqrl meta TASK`: evolve part of a learning rule (or hyperparameters) over vmapped inner trainings."""

    task: str = "value-loss"
    """What to evolve: value-loss (PPO's value loss, fitness the mean return over the whole inner run), lpo
    (PPO's drift network, fitness the final return), hparams (the traced hyperparameters of --algo), mfos
    (an opponent-shaping meta-policy in a matrix game) or act (a cheap-talk adversary of PPO victims)."""

    env: str = DEFAULT_ENV
    """Inner environment: a gymnax id (CartPole-v1, Breakout-MinAtar, ...) or brax:NAME."""

    algo: str = "ppo"
    """Inner algorithm (hparams: ppo, dqn, td3, sac or impala; value-loss and lpo evolve a part of ppo)."""

    strategy: str = "open_es"
    """Evolution strategy: open_es, snes, cma_es or simple_ga (presets in `sparqrl.meta.strategies`)."""

    generations: int = 0
    """Generations (ask -> inner trainings -> tell) in the whole run; 0: the task's own (`TASK_GENERATIONS`: 40
    for act, else 16)."""

    popsize: int = 32
    """Population size (even for open_es with antithetic sampling)."""

    seeds: int = 0
    """Inner trainings (seeds) per member per generation; the member's fitness is their mean. 0: the task's own
    (`task_defaults`: 1 for mfos es and act, else 2)."""

    steps: int = 0
    """Inner env steps per training (the inner config's total_timesteps); 0: the inner config's own."""

    fitness: str = ""
    """lifetime (mean return over the whole inner run) or final (mean return of the last 10 % of updates);
    empty: the task's own (value-loss lifetime, the others final)."""

    fitness_shaping: str = ""
    """centered_rank, z_score (or a strategy's other choices); empty: the task's own with open_es (mfos es:
    z_score), else centered_rank where the strategy allows it (open_es, snes, simple_ga), else its own (cma_es:
    weights)."""

    antithetic: bool = True
    """Antithetic sampling (open_es): each perturbation is paired with its mirror; popsize must be even."""

    sigma: float = 0.0
    """Initial search std; 0: the task's own with open_es (mfos es 0.1, act 0.1), else the strategy's preset."""

    lr: float = 0.0
    """Learning rate of the strategy's mean update (open_es, snes); 0: the task's own with open_es (mfos es 0.2,
    act 0.05), else the strategy's preset."""

    fields: str = ""
    """hparams: the traced fields to evolve, comma-separated (e.g. lr,clip_eps); empty: all of them."""

    game: str = "ipd"
    """mfos: the matrix game: ipd (iterated prisoner's dilemma), imp (iterated matching pennies) or chicken."""

    opponent: str = "nl"
    """mfos: the opponent's learning rule: nl (naive learner), lola, br (best response) or static; or self
    (meta-self-play: two M-FOS PPO agents, --trainer ppo, Adam 2e-4 as the reference's)."""

    trainer: str = "es"
    """mfos: es (the meta-policy evolved by --strategy) or ppo (the reference's PPO; a generation is then one
    meta-episode of --games games and one update)."""

    games: int = 0
    """mfos: meta-episodes played in parallel per fitness evaluation and seed (es) or per update (ppo); 0: 128
    (es) or 4096 (ppo), the reference's."""

    mode: str = "anti"
    """act: anti (the adversary lowers the victims' return), pro (raises it) or goal (steers the cart to a goal
    the adversary sees; CartPole-v1 only)."""

    adversary: str = "mlp"
    """act: the adversary's network: mlp (static, 2 x 64 relu: the one every documented act result used) or lstm
    (32 units, carried over the victim's lifetime: the reference's train-time default)."""

    victim: str = "cpu"
    """act on CartPole-v1: the PPO victim's budget, ACT's victim (§3.2) otherwise: cpu (4 envs x 128 steps x 16
    updates, 8,192 env steps: the documented CPU results') or paper (ACT's 4 x 256 x 32, 32,768 env steps: the
    GPU runs'). --set num_steps=... / total_timesteps=... change either."""

    n_dims: int = 2
    """act: the message's size (entries appended to the victim's observation)."""

    final_seeds: int = 32
    """act: victims the final evaluation trains with the evolved adversary, and as many with a silent one on the
    same keys, for summary.json. One victim's return over its last 10 % of updates spreads by 20-45 over keys
    (CartPole), so 8 victims cannot tell a 10-point effect from chance; 32 halve that standard error."""

    seed: int = 0
    """Seed of the whole meta run (strategy and inner trainings)."""

    set: tuple[str, ...] = ()
    """key=value overrides of the inner algorithm's config (e.g. num_envs=4)."""

    out: str = "runs/meta"
    """Output folder."""

    overwrite: bool = False
    """Replace the sparqrl run already in --out (only the files it wrote are deleted)."""

    progress: bool = True
    """Show a progress bar over generations."""

    energy: bool = True
    """Measure energy and CO2 with codecarbon's offline tracker."""

    country: str = "USA"
    """3-letter ISO code of the grid's country, for the CO2 figure."""

    wandb: str | None = None
    """Also log to this Weights & Biases project (the wandb extra): the meta/ scalars TensorBoard gets,
    config.json, summary.json and the run's files, as `sparqrl train --wandb` does; W&B's folder is OUT/wandb."""

    wandb_mode: str = "offline"
    """offline (W&B writes only OUT/wandb, nothing leaves the machine; `wandb sync OUT/wandb` uploads it later)
    or online."""

    @classmethod
    def upgrade_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """A saved config.json of an older sparqrl in today's fields (`config.from_dict`): an act run saved
        before `final_seeds` existed resumes with the 8 final victims it was started with, one saved before `victim`
        existed with ACT's own victim."""
        data = dict(data)
        if data.get("task") == "act":
            data.setdefault("final_seeds", ACT_FINAL_SEEDS_BEFORE)
            data.setdefault("victim", ACT_VICTIM_BEFORE)
        return data

    @property
    def fitness_kind(self) -> str:
        """The fitness asked for, else the task's: the M-FOS meta-agent's mean reward per round (no other
        choice), the lifetime return for value-loss and act, the final return otherwise."""
        if self.fitness:
            return self.fitness
        if self.task == "mfos":
            return "meta_return"
        return "lifetime" if self.task in ("value-loss", "act") else "final"
