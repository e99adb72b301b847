import os

import pytest

# Tests run on the CPU, in float32, and must not grab all memory on a GPU machine.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Tests that start Ray run one after another in one xdist worker (`pytest -n 2 --dist loadgroup`): two Ray
# instances at once on this 2-core machine (one of them a cluster started with `ray start`) made actor
# start-ups fail.
RAY_SERIAL = pytest.mark.xdist_group("ray")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (read from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_cli(capsys, *argv):
    """`sparqrl ARGV` in this process: (exit code, stdout, stderr)."""
    from sparqrl.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def fitness_rows(out):
    """A meta run's fitness.csv rows, without the wall times (equal runs differ only there)."""
    import csv

    with (out / "fitness.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in csv.DictReader(f)]


def meta_checkpoint(out):
    """A meta run's newest checkpoint: (strategy state as host arrays, its meta dict), restored into the shapes
    its saved config gives (`sparqrl.meta.run.MetaDriver`)."""
    import jax

    from sparqrl.meta import run as meta_run
    from sparqrl.runners.checkpoint import Checkpointer

    _, config = meta_run.open_meta_dir(str(out))
    checkpointer = Checkpointer(out / "checkpoint", read_only=True)
    try:
        restored = checkpointer.restore_intact(meta_run.MetaDriver(meta_run.prepare(config)).abstract_state())
    finally:
        checkpointer.close()
    return jax.device_get(restored.state), restored.meta


def train_and_evaluate(config, env, seed, num_seeds, episodes=10):
    """PPO's whole run (`make_train_fn`) for `num_seeds` keys split from PRNGKey(seed), vmapped, then each seed's
    deterministic returns [num_seeds, episodes]."""
    import time

    import jax
    import numpy as np

    from sparqrl.algos import base, ppo

    algo = ppo.make_algorithm(config, env)

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, _ = base.make_train_fn(algo)(train_key)
        return base.evaluate(env, algo.act, algo.policy(state), eval_key, episodes)

    start = time.perf_counter()
    returns = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(seed), num_seeds))
    returns = np.asarray(jax.block_until_ready(returns))
    print(f"\n{env.name}: per-seed mean returns {returns.mean(axis=1)}, {time.perf_counter() - start:.0f} s")
    return returns


LEARNING_DEVICES = 2  # what `sparqrl train --seeds 2` makes on any CPU with 2 cores or more (sparqrl.devices)


def train_as_users_do(out, algo, env, seeds=2, steps=None, sets=(), options=()):
    """`sparqrl train ALGO --env ENV --seeds SEEDS` in a subprocess, the seeds spread over LEARNING_DEVICES CPU
    devices as the command spreads them on a multi-core CPU (set here, so the layout does not depend on the CI
    machine's cores), with the command's chunking: a learning test measures the path a user's run takes, not
    an in-process program of its own; `options`, more command-line words (`--actors 2`: the actor-learner runner,
    whose seeds share one learner and are not spread). Returns summary.json; each seed's return is
    `final_return_per_seed`."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    argv = ["train", algo, "--env", env, "--seeds", str(seeds), "--out", str(out), "--no-progress", "--no-energy"]
    argv += (["--steps", str(steps)] if steps else []) + [w for item in sets for w in ("--set", item)] + list(options)
    env_vars = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={LEARNING_DEVICES}",
                "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("sparqrl")), *argv], env=env_vars, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((Path(out) / "summary.json").read_text())
    print(f"\nsparqrl {' '.join(argv)}: per seed {summary['final_return_per_seed']}, "
          f"{summary.get('seed_spread', 'one learner')}, {time.perf_counter() - start:.0f} s")
    return summary


def train_on_host_as_users_do(out, algo, env, steps, options=()):
    """`train_as_users_do` on the actor-learner runner, `--actors 2` (and `options`), on the back-end the command
    picks: checks it ran there (Ray, 2 actors) and returns summary.json."""
    summary = train_as_users_do(out, algo, env, steps=steps, options=("--actors", "2", *options))
    print({k: summary.get(k) for k in ("policy_lag_mean", "fragments_dropped", "env_steps_per_s")})
    assert summary["backend"] == "ray" and summary["actors"] == 2
    return summary


def last_metric(out, name):
    """Each seed's `name` in the last chunk's rows of a run's metrics.csv."""
    import csv
    from pathlib import Path

    with (Path(out) / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    last = max(int(row["chunk"]) for row in rows)
    return [float(row[name]) for row in rows if int(row["chunk"]) == last]
