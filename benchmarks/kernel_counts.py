"""Kernels per PPO update, sparqrl against rejax, read from XLA's optimized program (issue 11, item 1).

    bash benchmarks/setup_rejax.sh                 # once: the peer's venv (.bench-rejax-venv)
    .venv/bin/python benchmarks/kernel_counts.py [--updates 8] [--json OUT]
    .venv/bin/python benchmarks/kernel_counts.py --time 3 [--seeds 8]   # and time the same programs

For a small network on a CPU, a compiled RL program's time goes mostly to launching kernels (XLA's
top-level instructions: fusions, dots, copies), not to arithmetic. This script compiles each side's
1-seed whole PPO program (CartPole-v1, sparqrl's default hyperparameters on both sides, as
benchmarks/vs_rejax.py; rejax with its evaluation callback replaced by a no-op), parses the optimized
HLO (`compiled.as_text()`), and counts, per loop body, the instructions that run as kernels (not
parameter, get-tuple-element, tuple, constant or bitcast). Per update it prints each loop's body size
and the executed count: a `while` counts trip count x (its body's executed count), a `conditional` its
largest branch, a `call` its callee. The counts are exact for this jax/XLA version.

With `--time N` it also times the same whole programs at the full budget (976 updates, 499,712 env steps per
seed; `--seeds` > 1: vmapped), in N rounds of fresh processes that alternate sparqrl, rejax (so the machine's
drift hits both alike), best of 3 executions after a warm-up in each process. `--runner` adds a third process
to each round: sparqrl's runner (`sparqrl.runners.train`, the default 50 chunks, the same settings as
benchmarks/vs_rejax.py's runner: one evaluation and one checkpoint at the end, no progress, energy or
compile cache), a warm-up run then the best of 3 runs' `steady_env_steps_per_s` (chunks 2 to 50 with the
host's work between them) and `env_steps_per_s` (the whole run without compilation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-rejax-venv" / "bin" / "python"
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}
INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w\-]*)\((.*)$")
HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")


def computations(hlo: str) -> dict[str, list[tuple[str, str, str]]]:
    """{computation name: [(instruction name, opcode, rest of the line)]} of an HLO module's text."""
    comps: dict[str, list[tuple[str, str, str]]] = {}
    current = None
    for line in hlo.splitlines():
        header = HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(1)
            comps[current] = []
        elif current is not None and (m := INSTRUCTION.match(line)):
            comps[current].append(m.groups())
    return comps


def trips(rest: str) -> int:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
    if m is None:
        raise SystemExit(f"a loop without a known trip count: {rest[:200]}")
    return int(m.group(1))


def executed(comps: dict, name: str) -> int:
    """Kernels run by one execution of computation `name`, loops and branches included."""
    total = 0
    for _, op, rest in comps[name]:
        if op in FREE:
            continue
        if op == "while":
            total += trips(rest) * executed(comps, re.search(r"body=%?([\w.\-]+)", rest).group(1))
        elif op == "conditional":
            branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
            names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else
                     re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", rest))
            total += 1 + max(executed(comps, b) for b in names)
        elif op == "call":
            total += executed(comps, re.search(r"to_apply=%?([\w.\-]+)", rest).group(1))
        else:
            total += 1
    return total


def loops(comps: dict, name: str, depth: int = 0) -> list[dict]:
    """The loops inside computation `name`, outermost first, with their body's own kernels."""
    found = []
    for _, op, rest in comps[name]:
        if op in ("while", "call"):
            key = "body" if op == "while" else "to_apply"
            body = re.search(key + r"=%?([\w.\-]+)", rest).group(1)
            if op == "while":
                kinds = Counter(o for _, o, _ in comps[body] if o not in FREE)
                found.append({"depth": depth, "trips": trips(rest), "kernels": sum(kinds.values()),
                              "executed": executed(comps, body), "kinds": dict(kinds.most_common())})
            found += loops(comps, body, depth + (op == "while"))
    return found


def analyse(hlo: str, updates: int) -> dict:
    comps = computations(hlo)
    entry = next(n for n, c in comps.items() if n.startswith("main"))
    candidates = [(body, rest) for n in comps for _, op, rest in comps[n] if op == "while"
                  and trips(rest) == updates for body in [re.search(r"body=%?([\w.\-]+)", rest).group(1)]]
    if not candidates:
        raise SystemExit(f"no loop of {updates} trips (the updates) in {entry}")
    body = max(candidates, key=lambda c: executed(comps, c[0]))[0]
    return {"per_update": executed(comps, body), "update_body": sum(1 for _, o, _ in comps[body] if o not in FREE),
            "loops": [lp for lp in loops(comps, body) if lp["kernels"] > 0]}


def build(side: str, updates: int):
    import jax

    if side == "sparqrl":
        from sparqrl.algos import make_train_fn, ppo
        from sparqrl.envs import make_env

        env = make_env("CartPole-v1")
        config = ppo.Config(total_timesteps=updates * 512).validate(env)
        return jax.jit(make_train_fn(ppo.make_algorithm(config, env)))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peer_rejax import PPO_DEFAULTS, make_ppo

    algo, _ = make_ppo(dict(PPO_DEFAULTS), updates * 512)
    return jax.jit(algo.replace(eval_callback=lambda algo, ts, rng: ()).train)


def worker(side: str, updates: int) -> dict:
    import jax

    hlo = build(side, updates).lower(jax.random.PRNGKey(0)).compile().as_text()
    return {"side": side, "jax": jax.__version__, **analyse(hlo, updates)}


def timer(side: str, updates: int, seeds: int) -> dict:
    import time

    import jax

    fn, keys = build(side, updates), jax.random.split(jax.random.PRNGKey(1), seeds)
    fn, arg = (fn, keys[0]) if seeds == 1 else (jax.jit(jax.vmap(fn)), keys)
    compiled = fn.lower(arg).compile()
    jax.block_until_ready(compiled(arg))
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(compiled(arg))
        runs.append(time.perf_counter() - start)
    return {"side": side, "seeds": seeds, "run_s": min(runs), "env_steps_per_s": updates * 512 * seeds / min(runs)}


def runner_timer(updates: int, seeds: int) -> dict:
    from vs_rejax import runner_config  # (benchmarks/ is this script's folder)

    from sparqrl.algos import ppo
    from sparqrl.runners import train
    from sparqrl.runners.session import use_compile_cache

    use_compile_cache(False)
    config = ppo.Config(total_timesteps=updates * 512)
    summaries = []
    for _ in range(4):  # a warm-up run, then 3 timed
        with tempfile.TemporaryDirectory() as out:
            summaries.append(train("ppo", config, runner_config(seeds, 50, out)))
    return {"side": "runner", "seeds": seeds, "env_steps_per_s": max(s["steady_env_steps_per_s"] for s in summaries[1:]),
            "whole_run_env_steps_per_s": max(s["env_steps_per_s"] for s in summaries[1:])}


def run_side(side: str, *flags: str, pythons: dict[str, tuple[str, str | None]]) -> dict:
    """`side`'s worker in a fresh process; `pythons`: per side (interpreter, PYTHONPATH or None)."""
    python, path = pythons["rejax" if side == "rejax" else "sparqrl"]
    env = {**os.environ, "PYTHONPATH": path} if path else None
    proc = subprocess.run([python, __file__, "--side", side, *flags], capture_output=True, text=True, cwd=ROOT,
                          env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=8, help="updates of the compiled programs (4 envs x 128 steps)")
    parser.add_argument("--time", type=int, default=0, help="rounds of timing processes (0: count only)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the timed programs (vmapped)")
    parser.add_argument("--runner", action="store_true", help="with --time: sparqrl's runner (50 chunks) too")
    parser.add_argument("--side", choices=("sparqrl", "rejax", "runner"), help=argparse.SUPPRESS)
    parser.add_argument("--timer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON, help="rejax's interpreter (a GPU machine's)")
    parser.add_argument("--peer-pythonpath", default=None, help="PYTHONPATH of the rejax side (a GPU machine's)")
    parser.add_argument("--sparqrl-pythonpath", default=None, help="PYTHONPATH of the sparqrl side (a GPU machine's)")
    args = parser.parse_args()
    pythons = {"sparqrl": (sys.executable, args.sparqrl_pythonpath),
               "rejax": (str(args.peer_python), args.peer_pythonpath)}
    if args.side == "runner":
        print(json.dumps(runner_timer(976, args.seeds)))
        return
    if args.side:
        print(json.dumps(timer(args.side, 976, args.seeds) if args.timer else worker(args.side, args.updates)))
        return
    if not args.peer_python.exists():
        raise SystemExit(f"{args.peer_python} not found: run `bash benchmarks/setup_rejax.sh` first")
    results = {side: run_side(side, "--updates", str(args.updates), pythons=pythons) for side in ("sparqrl", "rejax")}
    print(f"PPO CartPole-v1, 1 seed, jax {results['sparqrl']['jax']} / {results['rejax']['jax']}: kernels per update")
    print(f"  {'':38s} {'sparqrl':>8s} {'rejax':>8s}")
    print(f"  {'executed per update (loops unrolled)':38s} {results['sparqrl']['per_update']:>8,} "
          f"{results['rejax']['per_update']:>8,}")
    print(f"  {'the update loop body itself':38s} {results['sparqrl']['update_body']:>8} "
          f"{results['rejax']['update_body']:>8}")
    for side in ("sparqrl", "rejax"):
        print(f"  {side}'s loops (trips: body kernels, executed per entry):")
        for lp in results[side]["loops"]:
            top = ", ".join(f"{k} {v}" for k, v in list(lp["kinds"].items())[:4])
            print(f"    {'  ' * lp['depth']}{lp['trips']:>4} trips: {lp['kernels']:>4} ({top}); {lp['executed']:,}")
    timings = []
    sides = ("sparqrl", "runner", "rejax") if args.runner else ("sparqrl", "rejax")
    for round_ in range(args.time):
        timed = {side: run_side(side, "--timer", "--seeds", str(args.seeds), pythons=pythons) for side in sides}
        timings.append(timed)
        r = timed["rejax"]["env_steps_per_s"]
        line = ", ".join(f"{side} {timed[side]['env_steps_per_s']:,.0f} ({timed[side]['env_steps_per_s'] / r:.3f}x)"
                         for side in sides[:-1])
        print(f"  timed round {round_ + 1}, {args.seeds} seed(s), 499,712 steps each, env steps/s: {line}, rejax {r:,.0f}")
    if timings:
        best = {side: max(t[side]["env_steps_per_s"] for t in timings) for side in sides}
        print(f"  best of {len(timings)}: " + ", ".join(
            f"{side} {best[side]:,.0f} ({best[side] / best['rejax']:.3f}x)" for side in sides[:-1]) +
            f", rejax {best['rejax']:,.0f}")
    if args.json:
        args.json.write_text(json.dumps({**results, "timings": timings}, indent=2) + "\n")


if __name__ == "__main__":
    main()
