"""ActorQ actor kernels: per-call latency of the policy forward pass at each broadcast precision, on
one CPU thread, and the bytes each precision's broadcast carries.

Network: ActorQ's actor width, obs 17 (HalfCheetah) -> 2048 -> 2048 -> 2048 -> 6, relu (the activation
does not matter for speed). Rows: fp32 with the jitted JAX forward (`backend='jax'`), fp32 with ONNX
Runtime's Gemm (sparqrl's default: same runtime as int8, float kernel), bf16 / fp16 (weight-only:
16-bit transport, fp32 Gemm), int8 per-channel and per-tensor (ORT DynamicQuantizeMatMul with the
exact weight encoding `sparqrl.quant.int8_kernel()` picks) and, where
that is not already u8s8, int8 with MLAS's u8s8 kernel (faster, but saturates on CPUs without VNNI;
a control, not a choice). Ratios are latency int8 / fp32: below 1, int8 is faster.

Everything runs on one thread: XLA is pinned by ``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`` in ``XLA_FLAGS`` (set below, before jax is imported), ORT by
``intra_op_num_threads=1``. The machines are shared and noisy: every variant is timed in turn inside
each repeat (interleaved, in rotating order) and the median over repeats is printed.

    .venv/bin/python benchmarks/actorq_kernel.py [--batches 1,4,16,64,256] [--repeats 5]
                                                  [--hidden 2048,2048,2048] [--obs 17] [--act 6]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"]
).strip()

import argparse  # noqa: E402
from machine import cpu_name  # noqa: E402 (benchmarks/ is the script's folder)
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from sparqrl import quant  # noqa: E402

TARGET_S = 0.04  # time per measurement: long enough to average call jitter, short enough to interleave


def ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]




def random_stack(dims: list[int], seed: int = 0) -> quant.DenseStack:
    """PyTorch-default-like U(±1/√fan_in) weights and biases."""
    rng = np.random.default_rng(seed)
    kernels, biases = [], []
    for n_in, n_out in zip(dims[:-1], dims[1:]):
        bound = 1.0 / np.sqrt(n_in)
        kernels.append(rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32))
        biases.append(rng.uniform(-bound, bound, n_out).astype(np.float32))
    return quant.DenseStack(tuple(kernels), tuple(biases), "relu")


def per_call(fn: Callable[[np.ndarray], np.ndarray], obs: np.ndarray, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(obs)
    return (time.perf_counter() - start) / calls


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=ints, default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=ints, default=[2048, 2048, 2048])
    parser.add_argument("--obs", type=int, default=17)
    parser.add_argument("--act", type=int, default=6)
    args = parser.parse_args()

    dims = [args.obs, *args.hidden, args.act]
    stack = random_stack(dims)
    q = {p: quant.quantize(stack, p) for p in ("fp32", "bf16", "fp16")}
    q["int8 channel"] = quant.quantize(stack, "int8", "channel")
    q["int8 tensor"] = quant.quantize(stack, "int8", "tensor")
    kernel = quant.int8_kernel()
    variants: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "fp32 JAX": quant.make_forward(q["fp32"], backend="jax"),
        "fp32 ORT": quant.make_forward(q["fp32"]),
        "bf16": quant.make_forward(q["bf16"]),
        "fp16": quant.make_forward(q["fp16"]),
        "int8 ch": quant.make_forward(q["int8 channel"]),
        "int8 tensor": quant.make_forward(q["int8 tensor"]),
    }
    if kernel != "u8s8":
        variants["int8 ch u8s8*"] = quant.make_forward(q["int8 channel"], kernel="u8s8")

    print(f"cpu: {cpu_name()}, 1 thread (XLA_FLAGS={os.environ['XLA_FLAGS']!r}; ORT {ort.__version__} "
          f"intra_op_num_threads=1); int8 weight encoding: {kernel}")
    print(f"network: {' -> '.join(map(str, dims))} ({stack.activation}); median of {args.repeats} interleaved "
          f"repeats of ~{TARGET_S * 1e3:.0f} ms each")

    # accuracy, so a fast but wrong kernel shows: ||y - y_fp32|| / ||y_fp32|| at batch 64
    obs = np.random.default_rng(1).normal(size=(64, args.obs)).astype(np.float32)
    ref = variants["fp32 JAX"](obs)
    errors = {name: np.linalg.norm(fn(obs) - ref) / np.linalg.norm(ref) for name, fn in variants.items()}
    print("relative error vs fp32 (batch 64): " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))

    names = list(variants)
    print()
    print("per-call latency, ms")
    header = f"{'batch':>5} " + " ".join(f"{n:>13}" for n in names)
    header += f" {'int8ch/JAX':>10} {'int8ch/ORT':>10} {'int8t/JAX':>10} {'int8t/ORT':>10}"
    print(header)
    for batch in args.batches:
        obs = np.random.default_rng(batch).normal(size=(batch, args.obs)).astype(np.float32)
        calls = {}
        for name, fn in variants.items():
            fn(obs)  # compile (JAX) / warm up
            calls[name] = max(2, int(TARGET_S / max(per_call(fn, obs, 2), 1e-6)))
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                times[name].append(per_call(variants[name], obs, calls[name]))
        ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        row = f"{batch:>5} " + " ".join(f"{ms[n]:>13.3f}" for n in names)
        row += " " + " ".join(f"{ms[a] / ms[b]:>10.2f}" for a in ("int8 ch", "int8 tensor")
                              for b in ("fp32 JAX", "fp32 ORT"))
        print(row)
    if kernel != "u8s8":
        print("* u8s8: MLAS's int8-weight kernel; saturates int16 pair sums on this CPU (no VNNI): control only")

    print()
    print("bytes per broadcast (weights + scales + float32 biases)")
    fp32_bytes = quant.nbytes(q["fp32"])
    for name, qs in q.items():
        size = quant.nbytes(qs)
        print(f"  {name:<13} {size:>11,d} B  {size / fp32_bytes:.3f} of fp32")

    print()
    print("per published version (median of 5)")
    learner = median_time(lambda: quant.quantize(stack, "int8", "channel"), 5)
    build = median_time(lambda: quant.make_forward(q["int8 channel"]), 5)
    build_16 = median_time(lambda: quant.make_forward(q["bf16"]), 5)
    print(f"  learner: quantize int8 per-channel  {learner * 1e3:7.1f} ms")
    print(f"  actor:   make_forward int8 (ORT session build)  {build * 1e3:7.1f} ms")
    print(f"  actor:   make_forward bf16 (widen + ORT session build)  {build_16 * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
