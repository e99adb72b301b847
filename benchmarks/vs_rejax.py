"""sparqrl against rejax, side by side: PPO and DQN on CartPole-v1, same machine, same JAX.

    bash benchmarks/setup_rejax.sh                      # once: the peer's venv (.bench-rejax-venv)
    .venv/bin/python benchmarks/vs_rejax.py [--steps 500000] [--seeds-many 8] [--algos ppo,dqn]
                                            [--repeats 2] [--rounds 1] [--json OUT]

rejax (0.1.3) needs gymnax < 1.0 (it unpacks gymnax's 5-tuple step), sparqrl gymnax 1.x, so rejax
runs in its own venv; setup_rejax.sh pins there the same jax/jaxlib/flax/optax as sparqrl's, so both
sides compile with the same XLA. Both sides use sparqrl's default hyperparameters (the peer gets them
as JSON; benchmarks/peer_rejax.py's docstring maps every field and lists what rejax cannot match).

Each side runs in a fresh process of its own venv (so both compile cold), in the order sparqrl, rejax
for each algorithm, `--rounds` times (the best of each number over rounds counts). Each process:
  whole program, 1 seed      `jax.jit(train)` over one key (no vmap): compile = trace + lower + XLA
                             compile, timed apart; steady state = best of `--repeats` executions of the
                             compiled program with `block_until_ready`; env steps/s = steps / time;
  whole program, N seeds     the same for `jax.jit(jax.vmap(train))` over `--seeds-many` keys;
                             env steps/s = steps * N / time.
  sparqrl runner (sparqrl side only) `sparqrl.runners.train` with `--chunks 1` and with the default 50
                             chunks, alternating, `--repeats` times each, at 1 and N seeds:
                             `env_steps_per_s` and `compile_time_s` of its summary (compilation, of the
                             init, chunk and evaluation programs, is excluded from its steps/s), and
                             `steady_env_steps_per_s` (chunks 2 to 50 with the host work between them:
                             without init, the first chunk, the final evaluation and checkpoint);
                             RunConfig(eval_every=0: one evaluation at the end, which stays inside its
                             wall time; checkpoint only at the end; progress, energy and the
                             persistent compile cache off).
sparqrl's whole program is `make_train_fn(algo)` (as benchmarks/chunking.py): no evaluation, no
output. rejax's `train` runs with its evaluation callback replaced by a no-op and eval_freq = the
whole run (one fori_loop over all iterations). After the timing each side evaluates its trained
1-seed policy (`--eval-episodes`; not timed) as a check that the matched configs both learn.

Goals (issue 11, item 2), printed PASS / MISS (a benchmark never fails on a MISS), for each algorithm:
  steady-state env steps/s >= 1.0x rejax at 1 seed and at N seeds (the whole program; the runner's
  50-chunk default is shown against rejax too); the 50-chunk default within 5 % of one chunk (at 1 and
  N seeds); compile time <= rejax's (the whole-run program, 1 and N seeds; and the runner's init + chunk +
  evaluation programs, what a user waits for, against rejax's whole program). Each side runs once per
  round, one after the other, so this machine's drift (5-10 % within minutes) enters every ratio:
  benchmarks/kernel_counts.py --time alternates the sides' processes for steps/s, and
  benchmarks/compile_vs_rejax.py for compile times (with rejax's program with its own evaluation, which
  is what the runner's three programs compare with; compiled in a process of its own, since a second
  compile in a process reuses the first one's traced functions).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the timing helpers are the peer script's own (it runs in the peer's venv, this in sparqrl's): one copy
from peer_rejax import compile_timed, run_timed  # noqa: E402 (benchmarks/ is this script's folder)

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-rejax-venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_rejax.py"
ALGOS = ("ppo", "dqn")


# ---- the sparqrl side (run as `vs_rejax.py --worker ...` in a fresh process) -----------------------


def make_config(algo_name: str, steps: int, learning_starts: int | None):
    from sparqrl.algos import dqn, ppo

    if algo_name == "ppo":
        return ppo.Config(total_timesteps=steps)
    # rejax's side is PureJaxRL's one-step DQN (peer_rejax.py): the same here, not sparqrl's device default
    # (n = 3, lr 5e-4 annealed, a 100,000 replay, Double DQN), so that both run one program
    purejaxrl = dict(nstep=1, lr=2.5e-4, anneal_lr=False, buffer_size=10_000, double_dqn=False)
    if learning_starts is None:
        return dqn.Config(total_timesteps=steps, **purejaxrl)
    return dqn.Config(total_timesteps=steps, learning_starts=learning_starts, **purejaxrl)


def runner_config(seeds: int, chunks: int, out: str):
    """The runner's settings in this benchmark and kernel_counts.py: one evaluation and one checkpoint, both at
    the end; progress, energy and the compile cache off."""
    from sparqrl.runners import RunConfig

    return RunConfig(seeds=seeds, out=out, chunks=chunks, eval_every=0, checkpoint_every=chunks, progress=False,
                     energy=False, compile_cache=False, overwrite=True)


def sparqrl_worker(args: argparse.Namespace) -> dict:
    from sparqrl.runners.session import use_compile_cache

    use_compile_cache(False)  # before anything compiles: every compile below is a cold one
    import jax

    from sparqrl.algos import evaluate, get_algorithm, make_train_fn
    from sparqrl.envs import make_env
    from sparqrl.runners import train

    module = get_algorithm(args.worker_algo)
    env = make_env("CartPole-v1")
    config = make_config(args.worker_algo, args.steps, args.dqn_learning_starts).validate(env)
    algo = module.make_algorithm(config, env)
    steps = algo.num_updates * algo.env_steps_per_update
    n = args.seeds_many
    peer_config = dataclasses.asdict(config)
    if args.worker_algo == "dqn":  # (None: derived from the budget; the peer gets the resolved values)
        peer_config["learning_starts"] = config.learning_start_step
        peer_config["epsilon_anneal_time"] = config.epsilon_steps
    result = {"algo": args.worker_algo, "steps": steps, "config": peer_config,
              "device": f"{jax.devices()[0].device_kind} x{jax.device_count()} ({jax.default_backend()})"}

    train_fn = make_train_fn(algo)
    key = jax.random.PRNGKey(0)
    keys = jax.random.split(jax.random.PRNGKey(1), n)
    compiled, comp = compile_timed(train_fn, key)
    out, run = run_timed(compiled, key, args.repeats)
    result["one_seed"] = {**comp, **run, "seeds": 1, "env_steps_per_s": steps / run["run_s"]}
    if args.eval_episodes > 0:
        state = out[0]
        returns = evaluate(env, algo.act, algo.policy(state), jax.random.PRNGKey(2), args.eval_episodes)
        result["one_seed"]["final_return"] = float(returns.mean())
    del compiled, out

    compiled, comp = compile_timed(jax.vmap(train_fn), keys)
    _, run = run_timed(compiled, keys, args.repeats)
    result["many_seeds"] = {**comp, **run, "seeds": n, "env_steps_per_s": steps * n / run["run_s"]}
    del compiled

    runner: dict[str, dict] = {}
    if not args.no_runner:
        for seeds in (1, n):
            for _ in range(args.repeats):
                for chunks in (1, 50):  # alternate, so machine noise hits both alike
                    with tempfile.TemporaryDirectory() as tmp:
                        summary = train(args.worker_algo, config, runner_config(seeds, chunks, tmp))
                    entry = runner.setdefault(f"seeds{seeds}_chunks{chunks}", {
                        "seeds": seeds, "chunks": chunks, "steps_per_s_runs": [], "steady_runs": [],
                        "compile_time_s_runs": []})
                    entry["steps_per_s_runs"].append(summary["env_steps_per_s"])
                    entry["steady_runs"].append(summary["steady_env_steps_per_s"])
                    entry["compile_time_s_runs"].append(summary["compile_time_s"])
        for entry in runner.values():
            entry["env_steps_per_s"] = max(entry["steps_per_s_runs"])
            entry["steady_env_steps_per_s"] = max((x for x in entry["steady_runs"] if x is not None), default=None)
            entry["compile_time_s"] = entry["compile_time_s_runs"][0]  # the first: the coldest
    result["runner"] = runner
    return result


# ---- the driver ----------------------------------------------------------------------------------


def clean_env() -> dict:
    """The environment of both sides' processes: no persistent compilation cache (cold compiles)."""
    env = dict(os.environ)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE"):
        env.pop(name, None)
    return env


def run_json(cmd: list[str], what: str, timeout: float) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=clean_env(), timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    result = json.loads(lines[-1])
    result["process_wall_s"] = time.perf_counter() - start
    return result


def sparqrl_side(args: argparse.Namespace, algo: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-algo", algo, "--steps", str(args.steps),
           "--seeds-many", str(args.seeds_many), "--repeats", str(args.repeats),
           "--eval-episodes", str(args.eval_episodes)]
    if args.dqn_learning_starts is not None:
        cmd += ["--dqn-learning-starts", str(args.dqn_learning_starts)]
    if args.no_runner:
        cmd.append("--no-runner")
    return run_json(cmd, f"sparqrl {algo}", args.timeout)


def peer_side(args: argparse.Namespace, algo: str, config: dict) -> dict:
    cmd = [str(args.peer_python), str(PEER_SCRIPT), "--algo", algo, "--steps", str(config["total_timesteps"]),
           "--seeds", str(args.seeds_many), "--repeats", str(args.repeats), "--config", json.dumps(config),
           "--eval-episodes", str(args.eval_episodes)]
    return run_json(cmd, f"rejax {algo}", args.timeout)


def best_of(results: list[dict]) -> dict:
    """Merge rounds: the highest steps/s and the lowest compile time of each measurement."""
    if len(results) == 1:
        return results[0]
    merged = json.loads(json.dumps(results[0]))
    for part in ("one_seed", "many_seeds"):
        merged[part]["env_steps_per_s"] = max(r[part]["env_steps_per_s"] for r in results)
        merged[part]["run_s"] = min(r[part]["run_s"] for r in results)
        for k in ("trace_s", "lower_s", "xla_s", "compile_s"):
            merged[part][k] = min(r[part][k] for r in results)
    for name, entry in merged.get("runner", {}).items():
        entry["env_steps_per_s"] = max(r["runner"][name]["env_steps_per_s"] for r in results)
        if entry.get("steady_env_steps_per_s") is not None:
            entry["steady_env_steps_per_s"] = max(r["runner"][name]["steady_env_steps_per_s"] for r in results)
        entry["compile_time_s"] = min(r["runner"][name]["compile_time_s"] for r in results)
    merged["rounds"] = len(results)
    return merged


def plural(seeds: int) -> str:
    return f"{seeds} seed" + ("s" if seeds != 1 else "")


def ratios_and_goals(s: dict, p: dict, n: int) -> tuple[dict, list]:
    sps = lambda part, r: r[part]["env_steps_per_s"]  # noqa: E731
    run = s.get("runner", {})
    ratios = {
        "steps_1seed_whole": sps("one_seed", s) / sps("one_seed", p),
        f"steps_{n}seeds_whole": sps("many_seeds", s) / sps("many_seeds", p),
        "compile_1seed": s["one_seed"]["compile_s"] / p["one_seed"]["compile_s"],
        f"compile_{n}seeds": s["many_seeds"]["compile_s"] / p["many_seeds"]["compile_s"],
    }
    goals = [
        ("steps/s, 1 seed, whole program >= 1.0x rejax", ratios["steps_1seed_whole"], ratios["steps_1seed_whole"] >= 1.0),
        (f"steps/s, {plural(n)}, whole program >= 1.0x rejax", ratios[f"steps_{n}seeds_whole"],
         ratios[f"steps_{n}seeds_whole"] >= 1.0),
    ]
    for seeds, part in ((1, "one_seed"), (n, "many_seeds")):
        c50, c1 = run.get(f"seeds{seeds}_chunks50"), run.get(f"seeds{seeds}_chunks1")
        if c50 and c1:
            tag = "1seed" if seeds == 1 else f"{seeds}seeds"
            ratios[f"steps_{tag}_runner50"] = c50["env_steps_per_s"] / sps(part, p)
            ratios[f"chunks50_over_chunks1_{tag}"] = c50["env_steps_per_s"] / c1["env_steps_per_s"]
            goals.append((f"steps/s, {plural(seeds)}, runner 50 chunks >= 1.0x rejax",
                          ratios[f"steps_{tag}_runner50"], ratios[f"steps_{tag}_runner50"] >= 1.0))
            if c50.get("steady_env_steps_per_s"):
                ratios[f"steady_{tag}_runner50"] = c50["steady_env_steps_per_s"] / sps(part, p)
                goals.append((f"steady-state steps/s, {plural(seeds)}, runner 50 chunks >= 1.0x rejax",
                              ratios[f"steady_{tag}_runner50"], ratios[f"steady_{tag}_runner50"] >= 1.0))
            goals.append((f"runner, {plural(seeds)}: 50 chunks within 5 % of 1 chunk (>= 0.95x)",
                          ratios[f"chunks50_over_chunks1_{tag}"], ratios[f"chunks50_over_chunks1_{tag}"] >= 0.95))
    goals += [
        ("compile, 1 seed, whole program <= rejax's", ratios["compile_1seed"], ratios["compile_1seed"] <= 1.0),
        (f"compile, {plural(n)}, whole program <= rejax's", ratios[f"compile_{n}seeds"], ratios[f"compile_{n}seeds"] <= 1.0),
    ]
    for seeds, part in ((1, "one_seed"), (n, "many_seeds")):  # what a user of the runner waits for
        entry = run.get(f"seeds{seeds}_chunks1")  # (the first runner run at this seed count: the coldest)
        if entry:
            tag = "1seed" if seeds == 1 else f"{seeds}seeds"
            ratios[f"compile_{tag}_runner"] = entry["compile_time_s"] / p[part]["compile_s"]
            goals.append((f"compile, {plural(seeds)}, runner (init + chunk + eval) <= rejax's whole program",
                          ratios[f"compile_{tag}_runner"], ratios[f"compile_{tag}_runner"] <= 1.0))
    return ratios, goals


def print_table(algo: str, s: dict, p: dict, n: int, goals: list) -> None:
    def num(x, fmt="{:,.0f}"):
        return "-" if x is None else fmt.format(x)

    def row(label, a, b, fmt="{:,.0f}", ratio=True):
        r = f"{a / b:6.2f}x" if ratio and a is not None and b else ""
        print(f"  {label:<50}{num(a, fmt):>16}{num(b, fmt):>16}  {r}".rstrip())

    run = s.get("runner", {})
    print(f"\n{algo.upper()} CartPole-v1, {s['steps']:,} env steps per seed (rejax {p['steps']:,}); {s['device']}")
    print(f"  {'':<50}{'sparqrl':>16}{'rejax':>16}  sparqrl/rejax")
    for seeds, part in ((1, "one_seed"), (n, "many_seeds")):
        label = plural(seeds)
        row(f"{label}: env steps/s, whole program", s[part]["env_steps_per_s"], p[part]["env_steps_per_s"])
        for chunks in (50, 1):
            entry = run.get(f"seeds{seeds}_chunks{chunks}")
            if entry:
                row(f"{label}: env steps/s, runner --chunks {chunks}", entry["env_steps_per_s"],
                    p[part]["env_steps_per_s"])
                if entry.get("steady_env_steps_per_s"):
                    row(f"{label}:   steady state (chunks 2-{chunks})", entry["steady_env_steps_per_s"],
                        p[part]["env_steps_per_s"])
        row(f"{label}: compile s (trace+lower+XLA), whole program", s[part]["compile_s"], p[part]["compile_s"], "{:.2f}")
        split = "{trace_s:.2f}/{lower_s:.2f}/{xla_s:.2f}"
        print(f"  {'  of which trace / lower / XLA s':<50}{split.format(**s[part]):>16}{split.format(**p[part]):>16}")
        entry = run.get(f"seeds{seeds}_chunks1")
        if entry:
            row(f"{label}: compile s, runner (init+chunk+eval)", entry["compile_time_s"], p[part]["compile_s"], "{:.2f}")
        row(f"{label}: cores used (CPU s / wall s), best run", s[part]["cores_used"], p[part]["cores_used"], "{:.2f}",
            ratio=False)
    if "final_return" in s["one_seed"] and "final_return" in p["one_seed"]:
        row("final return, 1 seed (own eval, not timed)", s["one_seed"]["final_return"],
            p["one_seed"]["final_return"], "{:.1f}", ratio=False)
    print("  goals:")
    for text, value, ok in goals:
        print(f"    [{'PASS' if ok else 'MISS'}] {text}: {value:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--seeds-many", type=int, default=8, help="seeds of the vmapped runs")
    parser.add_argument("--algos", default="ppo,dqn", help="comma-separated: ppo, dqn")
    parser.add_argument("--repeats", type=int, default=2, help="executions of each compiled program (and runner "
                        "runs of each chunking); the best counts")
    parser.add_argument("--rounds", type=int, default=1, help="sparqrl/rejax process pairs per algorithm; the best "
                        "of each number over the rounds counts")
    parser.add_argument("--eval-episodes", type=int, default=16, help="final-policy check after the timing (0: off)")
    parser.add_argument("--dqn-learning-starts", type=int, default=None,
                        help="override dqn.Config.learning_starts on both sides (smoke tests with a tiny --steps)")
    parser.add_argument("--no-runner", action="store_true", help="skip sparqrl's runner (--chunks 1/50) runs")
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for one side's process")
    parser.add_argument("--json", default=None, help="write every number to this file")
    parser.add_argument("--worker-algo", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker_algo:
        print(json.dumps(sparqrl_worker(args)), flush=True)
        return

    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in ALGOS:
            raise SystemExit(f"--algos: {a!r} is not one of {', '.join(ALGOS)}")
    if not args.peer_python.exists():
        raise SystemExit(f"{args.peer_python} not found: run `bash benchmarks/setup_rejax.sh` first")

    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
              "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}, "algos": {}}
    n = args.seeds_many
    for algo in algos:
        sides: dict[str, list] = {"sparqrl": [], "rejax": []}
        for r in range(args.rounds):
            print(f"[{algo} round {r + 1}/{args.rounds}] sparqrl ...", file=sys.stderr, flush=True)
            s = sparqrl_side(args, algo)
            sides["sparqrl"].append(s)
            print(f"[{algo} round {r + 1}/{args.rounds}] rejax ...", file=sys.stderr, flush=True)
            sides["rejax"].append(peer_side(args, algo, s["config"]))
        s, p = best_of(sides["sparqrl"]), best_of(sides["rejax"])
        ratios, goals = ratios_and_goals(s, p, n)
        print_table(algo, s, p, n, goals)
        report["algos"][algo] = {"sparqrl": s, "rejax": p, "ratios": ratios,
                                 "goals": [{"goal": t, "ratio": v, "pass": ok} for t, v, ok in goals]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
