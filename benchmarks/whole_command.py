"""The whole `sparqrl train ppo --env CartPole-v1` command against a rejax script doing the same, from process start
to exit, cold compilation caches (issue 33, item 1).

    bash benchmarks/setup_rejax.sh                      # once: the peer's venv (.bench-rejax-venv)
    .venv/bin/python benchmarks/whole_command.py [--seeds 1,8] [--rounds 3] [--steps 500000] [--torch-env]
                                                 [--json OUT]

Each round runs, per seed count, a fresh sparqrl process, then a fresh rejax process (alternating, so that the
machine's drift hits both alike), each with an empty XDG_CACHE_HOME and HOME (cold compilation caches; JAX's
persistent cache is off on the rejax side anyway):
  sparqrl   `sparqrl train ppo --env CartPole-v1 --seeds N --out DIR`, as a user runs it, through the `sparqrl`
            script's own entry point (`sparqrl.entry:console`; `main` in a tree before it): its defaults (50
            chunks, an evaluation every 10 of them over 10 episodes per seed, checkpoints, metrics.csv,
            TensorBoard, returns.png, energy and CO2)
  rejax     benchmarks/peer_rejax_whole.py in the rejax venv: the same training (sparqrl's hyperparameters) with
            rejax's own evaluation in the program at the same cadence; it writes nothing
Per run: the process's wall time, measured here from its start to its exit, and where it went: for sparqrl,
summary.json's `time_s` (startup: the process until its run starts, mostly imports; compile; training;
evaluation; checkpoints; rest) and `exit` (after summary.json is written: closing files, Python's shutdown);
for rejax, its script's time_s (imports, build, compile, run: training with its evaluations) and `outside` (the
interpreter's start before the script's first line and its exit after the last). Printed: every run, then per seed count the best
and median wall time of each side and their ratio. Goal (issue 33, item 2): sparqrl at or below 0.8x rejax's
at 1 and 8 seeds on the CPU, also with torch installed (--torch-env); printed PASS / MISS (a benchmark never
fails on a MISS). Everything around training (evaluation, checkpoints, rest) is shown as a share of training.

--torch-env: the sparqrl side runs in .bench-torch-venv instead of .venv: a venv that sees sparqrl's (a .pth
file adds .venv's site-packages) and holds torch too (`--torch-spec`, default torch==2.15.0 from PyPI with its
dependencies, installed with the machine's pip configuration bypassed: PIP_CONFIG_FILE=/dev/null), made on first
use: where torch is installed, the command must not get slower (tensorboardX, which sparqrl used before, imported it).
On a GPU machine: benchmarks/gpu_whole_command.sh (1, 1024 and 4096 seeds in one go, from local wheels).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-rejax-venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_rejax_whole.py"
TORCH_VENV = ROOT / ".bench-torch-venv"
# the `sparqrl` script (pyproject.toml's entry point; `main` in a tree from before `console`)
ENTRY = ("import sys; from sparqrl import entry; sys.argv[0] = 'sparqrl'; "
         "getattr(entry, 'console', entry.main)()")
SPARQRL_PARTS = ("startup", "compile", "training", "evaluation", "checkpoints", "rest", "exit")
PEER_PARTS = ("outside", "imports", "build", "compile", "run")
GOAL = 0.8


def clean_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """A fresh process's environment: an empty cache folder and home (cold compiles, no user config); the
    caller's PATH, and what `extra` adds (a GPU machine's PYTHONPATH)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "PYTHONUNBUFFERED": "1"}
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return {**env, **extra}


def timed(command: list[str], env: dict[str, str], timeout: float, what: str, cwd: Path) -> tuple[float, str]:
    """(wall seconds from start to exit, stdout); a failed process ends the benchmark with its output. `cwd`: a
    folder holding no package (`python -c` puts it first on sys.path: run from the repository, the sparqrl there
    would be imported whatever --sparqrl-pythonpath names)."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    return wall, proc.stdout


def sparqrl_run(python: Path, seeds: int, steps: int, extra_args: list[str], env_extra: dict[str, str],
                timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="whole-sparqrl-") as folder:
        out = Path(folder) / "run"
        command = [str(python), "-c", ENTRY, "train", "ppo", "--env", "CartPole-v1", "--seeds", str(seeds),
                   "--steps", str(steps), "--out", str(out), *extra_args]
        wall, _ = timed(command, clean_env(Path(folder), env_extra), timeout, f"sparqrl ({seeds} seeds)",
                        Path(folder))
        summary = json.loads((out / "summary.json").read_text())
    parts = dict(summary.get("time_s") or {})  # (none from a sparqrl before it: --sparqrl-pythonpath OLD_TREE)
    if "total" in parts:
        parts["exit"] = wall - parts.pop("total")  # (negative by the clocks' resolution at most)
    return {"wall_s": wall, "time_s": parts, "final_return_mean": summary["final_return_mean"],
            "steady_env_steps_per_s": summary.get("steady_env_steps_per_s"), "device": summary["device"]}


def peer_run(python: Path, seeds: int, steps: int, env_extra: dict[str, str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="whole-rejax-") as folder:
        command = [str(python), str(PEER_SCRIPT), "--seeds", str(seeds), "--steps", str(steps)]
        wall, stdout = timed(command, clean_env(Path(folder), env_extra), timeout, f"rejax ({seeds} seeds)",
                             Path(folder))
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    inside = result["time_s"]
    # outside: the interpreter's start and exit, the process wall less the script's own total (not told apart)
    parts = {"outside": wall - inside["total"], **{k: inside[k] for k in ("imports", "build", "compile", "run")}}
    return {"wall_s": wall, "time_s": parts, "final_return_mean": result["final_return_mean"],
            "device": result["device"], "steps": result["steps"]}


def torch_venv(spec: str) -> Path:
    """.bench-torch-venv's python: sparqrl's venv seen through a .pth file, plus `spec` (made once)."""
    python = TORCH_VENV / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(TORCH_VENV)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "zz-sparqrl-venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    check = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"installing {spec} into {TORCH_VENV} ...", file=sys.stderr, flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", spec], check=True,
                       env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    version = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                             capture_output=True, text=True).stdout.strip()
    print(f"sparqrl side in {TORCH_VENV} with torch {version}", file=sys.stderr, flush=True)
    return python


def summarize(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    best = min(runs, key=lambda r: r["wall_s"])
    return {"best_s": min(walls), "median_s": statistics.median(walls), "walls_s": walls, "best_run": best}


def share_of_training(parts: dict) -> float | None:
    """Evaluation, checkpoints and the rest as a share of training (issue 33, item 5: at most 3 %)."""
    training = parts.get("training") or 0.0
    return (parts["evaluation"] + parts["checkpoints"] + parts["rest"]) / training if training else None


def fmt_parts(parts: dict, names: tuple[str, ...]) -> str:
    return " ".join(f"{k} {parts[k]:.2f}" for k in names if parts.get(k) is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,8", help="comma-separated seed counts")
    parser.add_argument("--rounds", type=int, default=3, help="sparqrl / rejax process pairs per seed count")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed (both sides)")
    parser.add_argument("--sparqrl-args", default="", help="more flags for the sparqrl command (space-separated)")
    parser.add_argument("--torch-env", action="store_true", help="run the sparqrl side where torch is installed too")
    parser.add_argument("--torch-spec", default="torch==2.15.0", help="what --torch-env installs (a pip spec)")
    parser.add_argument("--sparqrl-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    parser.add_argument("--sparqrl-pythonpath", default=None,
                        help="PYTHONPATH of the sparqrl side (a GPU machine's, or another tree: a before/after)")
    parser.add_argument("--peer-pythonpath", default=None, help="PYTHONPATH of the rejax side (a GPU machine's)")
    parser.add_argument("--no-peer", action="store_true", help="sparqrl alone")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for one process")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()

    seed_counts = [int(s) for s in args.seeds.split(",") if s.strip()]
    python = torch_venv(args.torch_spec) if args.torch_env else args.sparqrl_python
    if not args.no_peer and not args.peer_python.exists():
        raise SystemExit(f"{args.peer_python} not found: run `bash benchmarks/setup_rejax.sh` first")
    ours_env = {"PYTHONPATH": args.sparqrl_pythonpath} if args.sparqrl_pythonpath else {}
    peer_env = {"PYTHONPATH": args.peer_pythonpath} if args.peer_pythonpath else {}
    extra = args.sparqrl_args.split()

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.node(), "cpus": os.cpu_count(), "load_before": os.getloadavg(),
              "args": {k: str(v) for k, v in vars(args).items()}, "seeds": {}}
    runs: dict[int, dict[str, list]] = {n: {"sparqrl": [], "rejax": []} for n in seed_counts}
    for r in range(args.rounds):
        for n in seed_counts:
            s = sparqrl_run(python, n, args.steps, extra, ours_env, args.timeout)
            runs[n]["sparqrl"].append(s)
            print(f"[round {r + 1}/{args.rounds}, {n} seeds] sparqrl {s['wall_s']:7.2f} s  "
                  f"({fmt_parts(s['time_s'], SPARQRL_PARTS)}; return {s['final_return_mean']:.1f})", flush=True)
            if not args.no_peer:
                p = peer_run(args.peer_python, n, args.steps, peer_env, args.timeout)
                runs[n]["rejax"].append(p)
                print(f"[round {r + 1}/{args.rounds}, {n} seeds] rejax   {p['wall_s']:7.2f} s  "
                      f"({fmt_parts(p['time_s'], PEER_PARTS)}; return {p['final_return_mean']:.1f})", flush=True)
    report["load_after"] = os.getloadavg()

    print(f"\nwhole command, PPO CartPole-v1, {args.steps:,} env steps per seed, cold caches, {args.rounds} round(s)"
          f"{' (sparqrl where torch is installed)' if args.torch_env else ''}; device {runs[seed_counts[0]]['sparqrl'][0]['device']}")
    print(f"  {'seeds':>6} {'sparqrl best / median s':>24} {'rejax best / median s':>22} {'ratio best / median':>20}"
          f" {'around training':>16}")
    for n in seed_counts:
        ours = summarize(runs[n]["sparqrl"])
        entry = {"sparqrl": ours, "around_training_share": share_of_training(ours["best_run"]["time_s"])}
        line = f"  {n:>6} {ours['best_s']:>11.2f} / {ours['median_s']:<10.2f}"
        if runs[n]["rejax"]:
            peer = summarize(runs[n]["rejax"])
            ratios = (ours["best_s"] / peer["best_s"], ours["median_s"] / peer["median_s"])
            entry.update(rejax=peer, ratio_best=ratios[0], ratio_median=ratios[1], goal=GOAL,
                         passed=ratios[0] <= GOAL)
            line += f" {peer['best_s']:>9.2f} / {peer['median_s']:<10.2f} {ratios[0]:>9.3f} / {ratios[1]:<8.3f}"
        share = entry["around_training_share"]
        line += f" {'' if share is None else f'{100 * share:.1f} %':>10}"
        print(line)
        report["seeds"][str(n)] = entry
    for n in seed_counts:
        entry = report["seeds"][str(n)]
        if "ratio_best" in entry:
            print(f"  [{'PASS' if entry['passed'] else 'MISS'}] {n} seed(s): whole command <= {GOAL}x rejax's "
                  f"(best of rounds): {entry['ratio_best']:.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
