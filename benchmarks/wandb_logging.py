"""What `--wandb` costs a run (issue 34 item 7): W&B's per-chunk logging against TensorBoard's, its peer that
every run already pays, on one chunk's scalars; and W&B's start and end, once per session.

Both writers are the run's own (`sparqrl.telemetry.logger.TensorBoardWriter`, `sparqrl.telemetry.wandb_log.
WandbWriter`, offline), in a temporary folder. CPU time is this process's (W&B's service process works beside
it); on a shared machine it is the figure to read.

    .venv/bin/python benchmarks/wandb_logging.py [--chunks 500] [--scalars 11]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name  # noqa: E402


def children_cpu() -> float:
    """CPU seconds of this process's child processes so far (W&B's service, wandb-core), via psutil."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def per_chunk(writer, chunks: int, values: dict[str, float]) -> tuple[float, float, float]:
    """(wall, CPU of this process, CPU of its children) seconds per chunk of `writer.scalars`."""
    wall, cpu, others = time.perf_counter(), time.process_time(), children_cpu()
    for chunk in range(1, chunks + 1):
        writer.scalars(chunk * 4096, values)
    time.sleep(1.0)  # let W&B's service finish what it was sent
    return ((time.perf_counter() - wall - 1.0) / chunks, (time.process_time() - cpu) / chunks,
            (children_cpu() - others) / chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=500)
    parser.add_argument("--scalars", type=int, default=11, help="scalars per chunk (PPO logs 11)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    from sparqrl.telemetry.logger import TensorBoardWriter
    from sparqrl.telemetry.wandb_log import WandbWriter

    folder = Path(tempfile.mkdtemp(prefix="sparqrl-wandb-bench-"))
    (folder / "config.json").write_text(json.dumps({"algo": "ppo"}))
    values = {f"train/metric_{i}": 0.5 * i for i in range(args.scalars)}
    tensorboard = TensorBoardWriter(folder / "tensorboard")
    start = time.perf_counter()
    wandb = WandbWriter(folder, "sparqrl-bench", "offline", lambda: ["config.json", "summary.json"])
    started = time.perf_counter() - start
    tb_wall, tb_cpu, _ = per_chunk(tensorboard, args.chunks, values)
    wb_wall, wb_cpu, wb_service = per_chunk(wandb, args.chunks, values)
    (folder / "summary.json").write_text(json.dumps({"final_return_mean": 0.0}))
    start = time.perf_counter()
    wandb.close()
    closed = time.perf_counter() - start
    tensorboard.close()
    shutil.rmtree(folder)
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"per chunk ({args.scalars} scalars, {args.chunks} chunks): TensorBoard {tb_wall * 1e3:.2f} ms wall, "
          f"{tb_cpu * 1e3:.2f} ms CPU; W&B {wb_wall * 1e3:.2f} ms wall, {wb_cpu * 1e3:.2f} ms CPU; "
          f"ratio W&B / TensorBoard (CPU) {wb_cpu / tb_cpu:.2f}; W&B's service process {wb_service * 1e3:.2f} ms CPU")
    print(f"W&B start {started:.2f} s (left out of env_steps_per_s), end with summary and artifact {closed:.2f} s")


if __name__ == "__main__":
    main()
