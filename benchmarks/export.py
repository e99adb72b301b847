"""Exported policies (`sparqrl export`): file bytes and per-observation latency of fp32, fp16, int8, sparse and
sparse+int8 ONNX files of an RLx2 policy and an ActorQ-size policy, side by side.

Policies (initialised through the library, not trained: size and speed do not depend on the values):

* RLx2: TD3's actor for HalfCheetah (obs 17 -> 256 -> 256 -> 6, relu, tanh head), dense, and sparse as
  RLx2 trains it (`sparse="rlx2"`, the paper's HalfCheetah actor sparsity, ER allocation, magnitude masks);
* ActorQ: the same actor at ActorQ's width, 17 -> 2048 -> 2048 -> 2048 -> 6 (as benchmarks/actorq_kernel.py),
  dense, and pruned the same way at the same sparsity (RLx2 at ActorQ's size).

Rows: fp32 / fp16 / int8 of the dense policy; the sparse policy with every kernel stored dense ("sparse,
dense file": the control), compactly (bitmap + kept values, "sparse") and compactly in int8. Each file is
loaded in ONNX Runtime on one thread (CPU provider, default graph optimizations: the compact kernels are
rebuilt once at load, so per-call kernels are the dense ones) and called with one observation at a time;
latency is the median over interleaved repeats (every variant timed in turn inside each repeat, in
rotating order: the machines are shared and noisy). "load ms" is the session build (median of 3),
which includes rebuilding compact kernels. "rel err" is ||a - a_fp32|| / ||a_fp32|| of the actions on
256 random observations against the fp32 file of the same policy (dense policy: its fp32; sparse: its
dense-file fp32).

    .venv/bin/python benchmarks/export.py [--repeats 7] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import numpy as np
import onnxruntime as ort

from sparqrl.algos import td3
from sparqrl.envs import Box
from sparqrl.envs.gym_env import HostSpec
from sparqrl.export import describe, export_policy, session

from machine import cpu_name  # (benchmarks/ is the script's folder)

TARGET_S = 0.05  # time per measurement: long enough to average call jitter, short enough to interleave
SPEC = HostSpec("gym:HalfCheetah-v5", (17,), Box.make(-1.0, 1.0, (6,)), 1000)  # shapes only: no MuJoCo needed


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())



def td3_actor(hidden: tuple[int, ...], sparse: str, seed: int = 0) -> tuple[Any, Any]:
    """(Policy, resolved config) of a freshly initialised TD3 actor, dense or RLx2-sparse."""
    config = td3.Config(hidden=hidden, sparse=sparse).validate(SPEC)
    agent = td3.make_agent(config, SPEC)  # networks and optimizers only: no replay buffer is allocated
    params = jax.tree.map(np.asarray, agent.policy(jax.jit(agent.init)(jax.random.PRNGKey(seed))))
    return describe("td3", config, SPEC.observation_shape, SPEC.action_space, params), config


def variants(hidden: tuple[int, ...]) -> tuple[dict[str, bytes], float]:
    """The exported files of one architecture by row name, and the sparse actor's sparsity."""
    dense, _ = td3_actor(hidden, "dense")
    pruned, config = td3_actor(hidden, "rlx2")
    files = {}
    for name, policy, precision, sparse in (
        ("fp32", dense, "fp32", "no"), ("fp16", dense, "fp16", "no"), ("int8", dense, "int8", "no"),
        ("sparse, dense file", pruned, "fp32", "no"), ("sparse", pruned, "fp32", "auto"),
        ("sparse+int8", pruned, "int8", "auto"),
    ):
        files[name] = export_policy(policy, None, precision, sparse=sparse)[0]
    return files, config.actor_sparsity


def per_call(run: Any, obs: np.ndarray, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run(None, {"obs": obs})
    return (time.perf_counter() - start) / calls


def measure(files: dict[str, bytes], obs: np.ndarray, repeats: int) -> dict[str, dict[str, float]]:
    """{row: {bytes, load_ms, latency_ms, rel_err}}."""
    loads = {name: [] for name in files}
    for _ in range(3):
        for name, data in files.items():
            start = time.perf_counter()
            session(data, threads=1)
            loads[name].append(time.perf_counter() - start)
    sessions = {name: session(data, threads=1) for name, data in files.items()}
    probe = np.random.default_rng(1).normal(size=(256, obs.shape[1])).astype(np.float32)
    actions = {name: s.run(None, {"obs": probe})[0] for name, s in sessions.items()}
    calls = {}
    for name, s in sessions.items():
        s.run(None, {"obs": obs})  # warm up
        calls[name] = max(2, int(TARGET_S / max(per_call(s.run, obs, 3), 1e-7)))
    names = list(files)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(per_call(sessions[name].run, obs, calls[name]))
    out = {}
    for name in names:
        ref = actions["sparse, dense file" if name.startswith("sparse") else "fp32"]
        out[name] = {
            "bytes": len(files[name]), "load_ms": statistics.median(loads[name]) * 1e3,
            "latency_ms": statistics.median(times[name]) * 1e3,
            "rel_err": float(np.linalg.norm(actions[name] - ref) / np.linalg.norm(ref)),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=1, help="observations per call (default 1)")
    parser.add_argument("--rlx2-hidden", type=ints, default=(256, 256))
    parser.add_argument("--actorq-hidden", type=ints, default=(2048, 2048, 2048))
    args = parser.parse_args()

    print(f"cpu: {cpu_name()}; ONNX Runtime {ort.__version__}, CPU provider, intra_op_num_threads=1; "
          f"batch {args.batch}; median of {args.repeats} interleaved repeats of ~{TARGET_S * 1e3:.0f} ms")
    obs = np.random.default_rng(0).normal(size=(args.batch, SPEC.observation_shape[0])).astype(np.float32)
    results = {}
    for label, hidden in (("RLx2", args.rlx2_hidden), ("ActorQ", args.actorq_hidden)):
        files, sparsity = variants(hidden)
        dims = " -> ".join(map(str, (SPEC.observation_shape[0], *hidden, SPEC.action_space.shape[0])))
        print(f"{label}: TD3 actor {dims} (relu, tanh head); sparse rows: RLx2 masks at actor sparsity {sparsity:.2f}")
        results[label] = measure(files, obs, args.repeats)

    labels = list(results)
    rows = list(results[labels[0]])
    print()
    header = f"{'':>20}" + "".join(f" | {label + ' bytes':>13} {'x fp32':>6} {'load ms':>8} {'ms/obs':>8} "
                                   f"{'x fp32':>6} {'rel err':>8}" for label in labels)
    print(header)
    print("-" * len(header))
    for row in rows:
        line = f"{row:>20}"
        for label in labels:
            r, base = results[label][row], results[label]["fp32"]
            line += (f" | {r['bytes']:>13,} {r['bytes'] / base['bytes']:>6.3f} {r['load_ms']:>8.2f} "
                     f"{r['latency_ms']:>8.4f} {r['latency_ms'] / base['latency_ms']:>6.2f} {r['rel_err']:>8.1e}")
        print(line)


if __name__ == "__main__":
    main()
