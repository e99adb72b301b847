"""Meta-evolution on a CPU budget (or a GPU, unchanged): what `sparqrl meta` learns and how fast.

    .venv/bin/python benchmarks/meta.py                          # lpo + value-loss + throughput, small sizes
    .venv/bin/python benchmarks/meta.py --popsize 32 --generations 30 --steps 65536   # reference-like value loss
    .venv/bin/python benchmarks/meta.py --throughput-popsize 64  # the 0.8x goal's size
    .venv/bin/python benchmarks/meta.py --dpo-vs-ppo --seeds 8 --dpo-steps 2000000     # MinAtar, CPU budget
    .venv/bin/python benchmarks/meta.py --dpo-vs-ppo --seeds 8 --dpo-envs brax:hopper,brax:ant --dpo-steps 50000000  # GPU
    .venv/bin/python benchmarks/meta.py --tiny                   # a smoke check of every part (seconds to minutes)

The reference's full budgets (GPU; reference §5-§6), when a GPU machine is available:

    .venv/bin/python benchmarks/meta.py --parts value-loss --popsize 128 --generations 512 --inner-seeds 2 --steps 500000
    .venv/bin/sparqrl meta lpo --env brax:ant --popsize 32 --generations 1025 --seeds 1 --steps 30000000 \
        --fitness-shaping z_score --set num_envs=2048 --set num_steps=5 --set num_minibatches=32 --set gamma=0.97 \
        --set lr=3e-4 --set ent_coef=0.01 --set normalize_obs=true --set anneal_lr=false --out runs/lpo-ant

Parts (every number comes from this process, on this machine):

  lpo          `sparqrl meta lpo` on --lpo-env (default CartPole-v1): PPO's drift network from its PPO-clip
               start, OpenES, fitness the final return; prints the mean / best fitness per generation, then
               PPO-clip and the learned drift scored on --eval-seeds fresh inner seeds (paired).
  value-loss   `sparqrl meta value-loss` on CartPole-v1 (PureJaxRL walkthrough, reference §6: fitness the mean
               return over the whole inner run): --popsize agents x --generations; then L2 (its start) and the
               learned loss on --eval-seeds fresh inner seeds. Both meta runs keep their folders under --out
               (fitness.csv, fitness.png, learned.png, best_meta_params.npz).
  throughput   inner env steps/s of ONE generation program (ask -> population x seeds PPO trainings with
               the learned value loss -> tell) against a vmapped `train` of as many trainings (popsize x
               seeds): the same inner run (learned loss at its start, as constants), and plain PPO (clipped
               value loss); both after compilation, best of --repeats.
               Goal: ratio >= 0.8 at popsize 64 (the meta machinery costs at most 20 %).
  --dpo-vs-ppo DPO vs PPO at equal budget on --dpo-envs (Breakout-MinAtar and SpaceInvaders-MinAtar; brax:NAME
               for the paper's Brax setting): --seeds seeds (>= 8) vmapped, --dpo-steps each, PureJaxRL's
               config for the env kind (`dpo_config`); final deterministic return (10 episodes per seed):
               mean and a 95 % bootstrap interval of the mean over seeds.

Benchmarks are not tests: nothing here fails on a missed goal.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from sparqrl.algos import base, ppo  # noqa: E402
from sparqrl.algos.ppo import objectives  # noqa: E402
from sparqrl.envs import make_env  # noqa: E402
from sparqrl.meta import make_strategy  # noqa: E402
from sparqrl.meta import run as meta_run  # noqa: E402
from sparqrl.meta import tasks as meta_tasks  # noqa: E402

GOAL_RATIO = 0.8


def device() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')} x{jax.device_count()}"


def inner_config(steps: int, num_envs: int, num_steps: int) -> ppo.Config:
    return ppo.Config(total_timesteps=steps, num_envs=num_envs, num_steps=num_steps)


def meta_run_and_compare(args: argparse.Namespace, task_name: str, env_name: str, num_steps: int) -> None:
    """One `sparqrl meta TASK` run (the product's own path: its folder gets fitness.csv/png, learned.png and
    best_meta_params.npz), then the start rule (PPO-clip / L2) and the learned centre scored by the task's
    own fitness on the same --eval-seeds fresh inner seeds, none of which the evolution saw."""
    out = Path(args.out) / task_name
    config = meta_run.MetaConfig(
        task=task_name, env=env_name, popsize=args.popsize, generations=args.generations, seeds=args.inner_seeds,
        steps=args.steps, set=(f"num_envs={args.num_envs}", f"num_steps={num_steps}"), strategy=args.strategy,
        seed=args.seed, out=str(out), overwrite=True, progress=False, energy=False)
    prepared = meta_run.prepare(config)
    start = time.perf_counter()
    summary = meta_run.run_meta(prepared, meta_run.start_meta_dir(prepared), resuming=False)
    wall = time.perf_counter() - start
    with open(out / meta_run.FITNESS_CSV) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        print(f"  generation {int(row['generation']):4d}: mean {float(row['mean_fitness']):8.2f}  "
              f"best {float(row['best_fitness']):8.2f}  best so far {float(row['best_so_far']):8.2f}")
    steps = prepared.task.env_steps * args.popsize * args.inner_seeds * args.generations
    print(f"  {args.generations} generations in {wall:.0f} s incl. compile ({summary.get('compile_time_s', 0):.0f} s): "
          f"{steps / wall:,.0f} inner env steps/s; pictures in {out}/fitness.png, {out}/learned.png")
    task = prepared.task
    learned = objectives.load_meta_params(out / objectives.META_PARAMS_FILE, task.init(None))
    keys = jax.random.split(jax.random.PRNGKey(1_000_003 + args.seed), args.eval_seeds)
    score = jax.jit(jax.vmap(lambda genome, key: task.fitness(genome, key)[0], in_axes=(None, 0)))
    before, after = np.asarray(score(task.init(None), keys)), np.asarray(score(learned, keys))
    rule = {"lpo": "PPO-clip (zero network)", "value-loss": "L2 (its initialisation)"}[task_name]
    for name, values in ((rule, before), ("learned (evolved centre)", after)):
        low, high = bootstrap_interval(values)
        print(f"  held-out fitness, {args.eval_seeds} seeds, {name:26s}: {values.mean():8.2f}  95% [{low:8.2f}, {high:8.2f}]")
    low, high = bootstrap_interval(after - before)
    print(f"  learned - start, paired: {np.mean(after - before):+8.2f}  95% [{low:+8.2f}, {high:+8.2f}]")


def part_lpo(args: argparse.Namespace) -> None:
    print(f"\n== LPO meta-training on {args.lpo_env}: population {args.popsize} x {args.inner_seeds} seeds, "
          f"{args.generations} generations, {args.steps} steps per training (fitness: final return) ==")
    meta_run_and_compare(args, "lpo", args.lpo_env, args.num_steps)


def part_value_loss(args: argparse.Namespace) -> None:
    print(f"\n== Learned value loss on CartPole-v1: {args.popsize} agents x {args.inner_seeds} seeds, "
          f"{args.generations} generations, {args.steps} steps per training (fitness: lifetime return) ==")
    meta_run_and_compare(args, "value-loss", "CartPole-v1", 64 if args.num_steps == 128 else args.num_steps)


def best_time(fn, *call_args, repeats: int) -> float:
    jax.block_until_ready(fn(*call_args))  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*call_args))
        times.append(time.perf_counter() - start)
    return min(times)


def part_throughput(args: argparse.Namespace) -> None:
    popsize, seeds = args.throughput_popsize, args.inner_seeds
    print(f"\n== Throughput: one generation (population {popsize} x {seeds} seeds) vs vmapped train of "
          f"{popsize * seeds} seeds, {args.steps} steps each, CartPole-v1 ==")
    env = make_env("CartPole-v1")
    config = inner_config(args.steps, args.num_envs, args.num_steps).validate(env)
    task = meta_tasks.make_value_loss_task(env, config)
    strategy = make_strategy("open_es", popsize, task.init(None))
    state = strategy.init(jax.random.PRNGKey(0), task.init(None))
    generation = jax.jit(meta_run.generation_program(task, strategy, seeds))
    key = meta_run.generation_key(0, 0)
    t_meta = best_time(generation, key, state, repeats=args.repeats)

    # The same inner training with the loss's parameters as constants (the start's), and plain PPO (its
    # clipped value loss: no value-loss network to evaluate), each as one vmapped program of as many seeds.
    same = ppo.make_algorithm(task.inner_config, env, objectives.MetaParams(value_loss=task.init(None)))
    keys = jax.random.split(jax.random.PRNGKey(0), popsize * seeds)
    steps = task.env_steps * popsize * seeds
    meta_sps = steps / t_meta
    print(f"  generation program: {t_meta:.3f} s, {meta_sps:,.0f} inner env steps/s")
    for name, algo in (("vmapped train, same inner run", same), ("vmapped train, plain PPO", ppo.make_algorithm(config, env))):
        train = jax.jit(jax.vmap(lambda k, algo=algo: base.make_train_fn(algo)(k)[1]))
        train_sps = steps / best_time(train, keys, repeats=args.repeats)
        ratio = meta_sps / train_sps
        verdict = ("PASS" if ratio >= GOAL_RATIO else "MISS") if popsize >= 64 else "n/a (goal at popsize 64)"
        print(f"  {name:30s}: {train_sps:,.0f} env steps/s; generation / this {ratio:.2f}x (goal >= {GOAL_RATIO}x): "
              f"{verdict}")


def bootstrap_interval(values: np.ndarray, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap percentile interval of the mean."""
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(draws, len(values)), replace=True).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def final_returns(config: ppo.Config, env, seeds: int, seed: int) -> np.ndarray:
    algo = ppo.make_algorithm(config, env)

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, _ = base.make_train_fn(algo)(train_key)
        return base.evaluate(env, algo.act, algo.policy(state), eval_key, 10).mean()

    return np.asarray(jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(seed), seeds)))


def dpo_config(env_name: str, args: argparse.Namespace) -> ppo.Config:
    """PureJaxRL's PPO config for the env's kind (reference §2.4), the same for both objectives; DPO adds
    only its drift (alpha 2, beta 0.6). MinAtar: lr 5e-3, 64 envs x 128 steps, 4 epochs, 8 minibatches,
    entropy 0.01 (its relu is --activation relu; tanh by default, as recorded). Brax (continuous, the DPO
    paper's setting): lr 3e-4, 2048 envs x 10 steps, 4 epochs, 32 minibatches, no entropy bonus, 256-256
    tanh, observations and rewards normalised, no lr annealing."""
    if env_name.startswith("brax:"):
        return ppo.Config(total_timesteps=args.dpo_steps, num_envs=2048, num_steps=10, num_minibatches=32, lr=3e-4,
                          ent_coef=0.0, hidden=(256, 256), activation="tanh", anneal_lr=False, normalize_obs=True,
                          normalize_reward=True)
    return ppo.Config(total_timesteps=args.dpo_steps, num_envs=args.minatar_envs, num_steps=128, lr=5e-3,
                      update_epochs=4, ent_coef=0.01, activation=args.activation, torso=args.torso,
                      num_minibatches=8 if args.minatar_envs * 128 % 8 == 0 else 1)


def part_dpo_vs_ppo(args: argparse.Namespace) -> None:
    print(f"\n== DPO vs PPO at equal budget: {args.seeds} seeds x {args.dpo_steps} steps on {args.dpo_envs} ==")
    if args.seeds < 8:
        print(f"  note: {args.seeds} seeds (the comparison asks for >= 8)")
    for env_name in args.dpo_envs.split(","):
        env, base_config = make_env(env_name), dpo_config(env_name, args)
        print(f"  {env_name} config: " + ", ".join(f"{k}={getattr(base_config, k)}" for k in (
            "lr", "num_envs", "num_steps", "update_epochs", "num_minibatches", "ent_coef", "hidden", "activation",
            "torso", "normalize_obs", "anneal_lr")))
        for objective in ("ppo-clip", "dpo"):
            start = time.perf_counter()
            returns = final_returns(dataclasses.replace(base_config, objective=objective), env, args.seeds, args.seed)
            low, high = bootstrap_interval(returns)
            print(f"  {env_name:22s} {objective:8s}: final return {returns.mean():8.2f}  95% [{low:8.2f}, {high:8.2f}]"
                  f"  ({time.perf_counter() - start:.0f} s incl. compile)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="lpo,value-loss,throughput", help="which of lpo,value-loss,throughput")
    p.add_argument("--popsize", type=int, default=8)
    p.add_argument("--generations", type=int, default=5)
    p.add_argument("--inner-seeds", type=int, default=2, help="inner seeds per member")
    p.add_argument("--steps", type=int, default=16_384, help="inner env steps per training")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--strategy", default="open_es")
    p.add_argument("--lpo-env", default="CartPole-v1")
    p.add_argument("--throughput-popsize", type=int, default=8, help="the goal is stated at 64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-seeds", type=int, default=32, help="lpo, value-loss: fresh inner seeds for start vs learned")
    p.add_argument("--out", default="runs/bench-meta", help="lpo, value-loss: the meta runs' folders (TASK/ inside)")
    p.add_argument("--dpo-vs-ppo", action="store_true", help="only the DPO vs PPO MinAtar comparison")
    p.add_argument("--seeds", type=int, default=8, help="--dpo-vs-ppo: seeds per objective and env")
    p.add_argument("--dpo-envs", default="Breakout-MinAtar,SpaceInvaders-MinAtar",
                   help="--dpo-vs-ppo: comma-separated envs (MinAtar ids, or brax:NAME for the paper's Brax setting)")
    p.add_argument("--dpo-steps", type=int, default=2_000_000, help="--dpo-vs-ppo: env steps per training")
    p.add_argument("--minatar-envs", type=int, default=64)
    p.add_argument("--activation", default="tanh", choices=("relu", "tanh"),
                   help="--dpo-vs-ppo, MinAtar: PPO's activation (PureJaxRL's MinAtar config has relu; the recorded "
                        "CPU run used tanh)")
    p.add_argument("--torso", default="mlp", choices=("mlp", "auto"),
                   help="--dpo-vs-ppo, MinAtar: PPO's torso (auto: the MinAtar Conv, slower on a CPU)")
    p.add_argument("--tiny", action="store_true", help="smoke sizes: every part runs in seconds")
    args = p.parse_args(argv)
    if args.tiny:
        args.popsize, args.generations, args.steps, args.num_steps = 4, 2, 256, 32
        args.throughput_popsize, args.repeats, args.eval_seeds = 4, 1, 4
        args.dpo_steps, args.minatar_envs, args.seeds = 2048, 8, 2
    print(f"device: {device()}")
    if args.dpo_vs_ppo:
        part_dpo_vs_ppo(args)
        return
    parts = {"lpo": part_lpo, "value-loss": part_value_loss, "throughput": part_throughput}
    for name in args.parts.split(","):
        parts[name.strip()](args)


if __name__ == "__main__":
    main()
