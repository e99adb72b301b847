"""The reproduction suite (issue 37): standard tasks at the budgets the literature reports, through the
`sparqrl train` command, beside the published figure and its source.

    .venv/bin/python benchmarks/repro.py --suite cpu --list                      # the entries, references, status
    nice -n 15 .venv/bin/python benchmarks/repro.py --suite cpu --only ppo-cartpole,dqn-cartpole
    .venv/bin/python benchmarks/repro.py --suite gpu --only ppo-atari-breakout  # on a GPU machine
    bash benchmarks/gpu_whole_command.sh repro ppo-breakout-minatar-16           # one without network access

Each entry is one `sparqrl train ALGO --env ENV --steps BUDGET --seeds N [--set ...]` in a subprocess (the path a
user's command takes). Its summary.json (`final_return_per_seed`: each seed's deterministic policy over its final
evaluation episodes) and metrics.csv are read back and written to

    OUT/<suite>.csv            entry, seed, final_return, budget, wall_time_s, commit, date, machine
    OUT/curves/<entry>.csv     env_step, then each seed's mean episode return in that logged chunk

(OUT is benchmarks/results by default). A rerun of an entry replaces its rows and its curve and leaves the other
entries' alone, so the suite can be run one entry at a time and recorded as each finishes.
`benchmarks/results_page.py` turns the committed CSVs into docs/results.md.

The commit recorded is the checkout this script lives in (`+dirty` when its sparqrl/ has uncommitted changes):
run it from the checkout whose sparqrl the `sparqrl` command imports. The `smoke` entry is the CI slice
(tests/test_repro.py): it runs only when named and never belongs in the committed results.
"""

from __future__ import annotations

import argparse
import csv
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

from whole_command import ENTRY  # (benchmarks/ is first on sys.path: this script's folder)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SUITES = ("cpu", "gpu")
RESULT_FIELDS = ("entry", "seed", "final_return", "budget", "wall_time_s", "commit", "date", "machine")

CLEANRL_PPO = "CleanRL ppo.py benchmark (docs.cleanrl.dev/rl-algorithms/ppo, classic control, 500k steps)"
CLEANRL_DQN = "CleanRL dqn.py benchmark (docs.cleanrl.dev/rl-algorithms/dqn, classic control, 500k steps)"
CLEANRL_DIFFERS = ("CleanRL: Gymnasium's env, mean return of its last training episodes (stochastic policy, "
                   "epsilon-greedy for DQN) over its seeds; ours: gymnax's env, deterministic policy over 10 "
                   "evaluation episodes per seed, sparqrl's default hyperparameters")


@dataclasses.dataclass(frozen=True)
class Reference:
    """A published figure at (or near) the entry's budget, and where it is published."""

    value: float
    spread: float | None
    """The ± published beside it (the standard deviation over the source's seeds); None where none is given."""
    source: str

    def text(self) -> str:
        return f"{self.value:.2f}" + (f" ± {self.spread:.2f}" if self.spread is not None else "")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    suite: str
    family: str
    algo: str
    env: str
    steps: int
    seeds: int
    reference: Reference | None
    """None: no published figure recorded here (none known for certain at this budget)."""
    differs: str
    """What differs from the reference: env version, budget, evaluation protocol."""
    settings: tuple[str, ...] = ()
    """`--set key=value` words (the entry's hyperparameters beyond the defaults and the env's preset)."""
    options: tuple[str, ...] = ()
    """More command-line words."""
    note: str = ""
    """Why it is not run on this machine, or what else a reader should know."""
    default: bool = True
    """Run by `--suite` without `--only` (False: only when named, as the CI slice)."""


def _classic(name: str, algo: str, env: str, value: float, spread: float) -> Entry:
    return Entry(name, "cpu", "gymnax classic control", algo, env, 500_000, 5,
                 Reference(value, spread, CLEANRL_PPO if algo == "ppo" else CLEANRL_DQN), CLEANRL_DIFFERS)


MINATAR_NOTE = ("10M steps x 3 seeds, one entry at a time on the shared 2-core CPU: 15 minutes at load 2-6, 56-70 "
                "minutes at load 7-54")
GYMNAX_MINATAR = {"Asterix": 15.0, "Breakout": 28.0, "Freeway": 58.0, "SpaceInvaders": 131.0}
"""The gymnax README's checkpoint returns (its table at commit 086ad95; older READMEs show "R: ???" for MinAtar)."""
GYMNAX_CKPT = ("gymnax README (commit 086ad95), 'Implemented Accelerated Environments': gymnax-blines' PPO/ES "
               "checkpoint return")
MINATAR_DIFFERS = ("gymnax: a checkpoint's return, its budget, config and evaluation not stated; ours: PureJaxRL's "
                   "MinAtar PPO config (the ppo-minatar preset: its notebook's relu 64-64 MLP on the flattened "
                   "observation, lr 5e-3, 64 envs x 128 steps) at 10M steps; PureJaxRL's own Breakout-MinAtar plot "
                   "ends near 40 (read off a figure, not a table); the MinAtar paper (Young & Tian 2019) reports DQN "
                   "and AC(lambda), not PPO")
MUJOCO_NOTE = ("host MuJoCo, measured with SAC x 2 seeds at once under nice 19 on the shared 2-core CPU: 95-105 env "
               "steps/s per seed at load 3, 31-40 at load 6-7 (300k steps: 50 minutes to 2.5 hours)")
SB3_ZOO_SAC_1M = {"HalfCheetah": "9535 ± 100", "Hopper": "2326 ± 1130"}
"""rl-baselines3-zoo benchmark.md (its sac rows: one trained agent each, mean ± std over its evaluation episodes)."""
GPU_NOTE = "a GPU machine's entry"
ENTRIES = (
    _classic("ppo-cartpole", "ppo", "CartPole-v1", 492.40, 13.05),
    _classic("ppo-acrobot", "ppo", "Acrobot-v1", -89.93, 6.34),
    _classic("ppo-mountaincar", "ppo", "MountainCar-v0", -200.00, 0.0),
    _classic("dqn-cartpole", "dqn", "CartPole-v1", 488.69, 16.11),
    _classic("dqn-acrobot", "dqn", "Acrobot-v1", -91.54, 7.20),
    _classic("dqn-mountaincar", "dqn", "MountainCar-v0", -194.95, 8.48),
    Entry("ppo-pendulum", "cpu", "gymnax classic control", "ppo", "Pendulum-v1", 300_000, 5,
          Reference(-130.0, None, "gymnax README, 'Implemented Accelerated Environments': gymnax-blines' PPO/ES "
                                "checkpoint return"),
          "gymnax: a checkpoint's return, budget and evaluation not stated; ours: the ppo-pendulum preset at 300k "
          "steps (the defaults matrix's budget)"),
    *(Entry(f"ppo-{game.lower()}-minatar", "cpu", "MinAtar", "ppo", f"{game}-MinAtar", 10_000_000, 3,
            Reference(value, None, GYMNAX_CKPT), MINATAR_DIFFERS, note=MINATAR_NOTE)
      for game, value in GYMNAX_MINATAR.items()),
    *(Entry(f"sac-{env.lower()}", "cpu", "Gymnasium MuJoCo", "sac", f"gym:{env}-v5", 300_000, 2, None,
            "the SAC paper (Haarnoja et al. 2018) plots MuJoCo v1 envs to 1-3M steps, no figure at 300k; "
            f"rl-baselines3-zoo's benchmark.md gives one SB3 SAC agent at 1M on {env}-v3, {zoo} (deterministic, "
            "150k evaluation steps)", note=MUJOCO_NOTE)
      for env, zoo in SB3_ZOO_SAC_1M.items()),
    Entry("td3-halfcheetah", "cpu", "Gymnasium MuJoCo", "td3", "gym:HalfCheetah-v5", 300_000, 1, None,
          "the TD3 paper (Fujimoto et al. 2018) tables returns at 1M steps on HalfCheetah-v1, not at 300k; "
          "rl-baselines3-zoo's benchmark.md gives one SB3 TD3 agent at 1M on HalfCheetah-v3, 9656 ± 970",
          note=MUJOCO_NOTE),
    Entry("td3-rlx2-halfcheetah", "cpu", "Gymnasium MuJoCo", "td3", "gym:HalfCheetah-v5", 300_000, 1, None,
          "the RLx2 paper (Tan et al. 2023) reports 3M steps; its sparsities for the env (sparse=rlx2)",
          settings=("sparse=rlx2",), note=MUJOCO_NOTE),
    Entry("ppo-brax-hopper", "gpu", "Brax", "ppo", "brax:hopper", 50_000_000, 5, None,
          "PureJaxRL's continuous PPO on Brax hopper (the ppo-brax preset's source)", note=GPU_NOTE),
    *(Entry(f"{algo}-atari-breakout", "gpu", "Atari", algo, "gym:ALE/Breakout-v5", 2_500_000, 3, None,
            "10M frames = 2.5M agent steps at frame skip 4; the env's preset", note=GPU_NOTE)
      for algo in ("ppo", "impala", "dqn")),
    *(Entry(f"ppo-{game.lower()}-minatar-16", "gpu", "MinAtar", "ppo", f"{game}-MinAtar", 10_000_000, 16,
            Reference(value, None, GYMNAX_CKPT), MINATAR_DIFFERS + "; 16 seeds", note=GPU_NOTE)
      for game, value in GYMNAX_MINATAR.items()),
    Entry("smoke", "cpu", "smoke", "ppo", "CartPole-v1", 10_000, 1, None,
          "the CI slice: checks the suite's machinery, not returns", default=False),
)


@dataclasses.dataclass(frozen=True)
class Peer:
    """Another library's run of an entry's task at the same budget, recorded in OUT/peers.csv (repro.py's columns,
    `commit` holding the peer's versions) and OUT/curves/<name>.csv by its own script."""

    name: str
    beside: str
    """The entry it is shown beside."""
    label: str
    source: str
    """Where its hyperparameters are published."""
    differs: str
    command: str


PEERS = (
    Peer("sb3-sac-halfcheetah", "sac-halfcheetah", "Stable-Baselines3 SAC",
         "rl-baselines3-zoo hyperparams/sac.yml, HalfCheetah-v3 (&mujoco-defaults: learning_starts 10000, SB3's SAC "
         "defaults otherwise)",
         "the suite's budget and evaluation (deterministic policy, 10 episodes per seed, the same env seeds); SB3 "
         "acts at random for 10k steps (sparqrl's SAC: 25k), clips the log-std to [-20, 2] (sparqrl: [-5, 2]), "
         "torch on 1 thread per seed; the peer venv's Gymnasium and MuJoCo (their versions under 'recorded')",
         ".venv/bin/python benchmarks/peer_sb3_sac.py --steps 300000 --seeds 2"),
)


def select(suite: str, only: str | None) -> list[Entry]:
    """The suite's entries named in `only` (comma-separated), or its default ones; an unknown name is an error."""
    entries = [e for e in ENTRIES if e.suite == suite]
    if only is None:
        return [e for e in entries if e.default]
    by_name = {e.name: e for e in entries}
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"--only: unknown {suite} entries {', '.join(unknown)}; one of {', '.join(by_name)}")
    return [by_name[n] for n in names]


def command(entry: Entry, out: Path) -> list[str]:
    """The `sparqrl train` words of `entry` writing to `out`."""
    sets = [w for s in entry.settings for w in ("--set", s)]
    return ["train", entry.algo, "--env", entry.env, "--steps", str(entry.steps), "--seeds", str(entry.seeds),
            *sets, *entry.options, "--out", str(out), "--overwrite", "--no-progress", "--no-energy"]


def commit() -> str:
    """This checkout's commit, `+dirty` when its sparqrl/ has uncommitted changes; $REPRO_COMMIT where the tree
    has no git (a GPU machine's copy: benchmarks/gpu_whole_command.sh)."""
    if os.environ.get("REPRO_COMMIT"):
        return os.environ["REPRO_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", "sparqrl") else "")


def machine() -> str:
    """Cores this process may use and the CPU's model name (the GPU's name is in summary.json's device)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return f"{cores}-core {model}"


def curve(metrics_csv: Path, seeds: int) -> list[list[str]]:
    """metrics.csv (a row per logged chunk per seed) -> rows [env_step, return of seed 0, ...], one per chunk;
    a seed that finished no episode in a chunk has an empty cell."""
    by_step: dict[int, list[str]] = {}
    with metrics_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            cells = by_step.setdefault(int(row["env_step"]), [""] * seeds)
            cells[int(row["seed"])] = row["episode_return"]
    return [[str(step), *cells] for step, cells in sorted(by_step.items())]


def write_curve(path: Path, rows: list[list[str]], seeds: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["env_step", *(f"seed_{i}" for i in range(seeds))])
        w.writerows(rows)


def replace_rows(path: Path, entry: str, rows: list[dict]) -> None:
    """Write `rows` for `entry` into the results CSV at `path`, replacing that entry's old rows and keeping the
    others' (in their order, the new entry's at the place of its old rows, else at the end)."""
    old = list(csv.DictReader(path.open(newline=""))) if path.exists() else []
    at = next((i for i, r in enumerate(old) if r["entry"] == entry), len(old))
    kept = [r for r in old if r["entry"] != entry]
    at = min(at, len(kept))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, RESULT_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(kept[:at] + rows + kept[at:])


def sparqrl_command() -> list[str]:
    """The `sparqrl` script beside this interpreter, or its entry point run by the interpreter where sparqrl is on
    PYTHONPATH but not installed (a GPU machine's: benchmarks/gpu_whole_command.sh)."""
    script = Path(sys.executable).with_name("sparqrl")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", ENTRY]


def run_entry(entry: Entry, out: Path, runs: Path) -> bool:
    """Train `entry` in a subprocess and record it under `out`; False (and nothing recorded) when it failed."""
    run_dir = runs / entry.name
    argv = command(entry, run_dir)
    print(f"{entry.name}: sparqrl {' '.join(argv)}", flush=True)
    head = commit()  # the code the run imports: taken before it, as others may commit during a long run
    start = time.perf_counter()
    done = subprocess.run([*sparqrl_command(), *argv], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(f"  FAILED ({wall:.0f} s): {(done.stderr.strip().splitlines() or ['exit %d' % done.returncode])[-1]}")
        return False
    summary = json.loads((run_dir / "summary.json").read_text())
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    device = summary.get("device", "cpu")
    where = machine() if device.startswith("cpu") else f"{device} ({machine()})"
    rows = [{"entry": entry.name, "seed": i, "final_return": f"{float(r):.2f}", "budget": summary["steps"],
             "wall_time_s": f"{summary['wall_time_s']:.1f}", "commit": head, "date": stamp, "machine": where}
            for i, r in enumerate(summary["final_return_per_seed"])]
    replace_rows(out / f"{entry.suite}.csv", entry.name, rows)
    write_curve(out / "curves" / f"{entry.name}.csv", curve(run_dir / "metrics.csv", entry.seeds), entry.seeds)
    returns = ", ".join(r["final_return"] for r in rows)
    print(f"  {returns}  ({summary['wall_time_s']:.0f} s of training, {wall:.0f} s in all)", flush=True)
    return True


def describe(entry: Entry) -> str:
    ref = f"{entry.reference.text()} ({entry.reference.source})" if entry.reference else "reference: not recorded"
    extra = " ".join(w for s in entry.settings for w in ("--set", s))
    return (f"{entry.name:<28} {entry.algo:<6} {entry.env:<22} {entry.steps:>11,} steps x {entry.seeds:<2} {extra}\n"
            f"{'':<28} {ref}\n{'':<28} differs: {entry.differs}" + (f"\n{'':<28} {entry.note}" if entry.note else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=SUITES, default="cpu")
    p.add_argument("--only", default=None, help="comma-separated entry names (default: the suite's entries)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the results CSV and curves go")
    p.add_argument("--runs", type=Path, default=None, help="keep the run folders here (default: a temporary one)")
    p.add_argument("--list", action="store_true", help="print the entries and exit")
    args = p.parse_args()
    entries = select(args.suite, args.only)
    if args.list:
        print("\n".join(describe(e) for e in entries))
        return 0
    with tempfile.TemporaryDirectory(prefix="sparqrl-repro-") as tmp:
        ok = [run_entry(e, args.out, args.runs or Path(tmp)) for e in entries]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
