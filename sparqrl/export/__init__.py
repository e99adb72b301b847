"""`sparqrl export`: a trained policy as one self-contained ONNX file that ONNX Runtime runs on raw NumPy
observations, with no sparqrl (or JAX) import.

    sparqrl export RUN_DIR --format onnx --precision fp32|fp16|int8 [--seed N] [--sparse auto|no]
                   --out policy.onnx [--overwrite]

    import onnxruntime as ort
    session = ort.InferenceSession("policy.onnx")
    action = session.run(None, {"obs": obs})[0]     # obs float32 [batch, *obs_shape] -> action

A recurrent policy (`--set memory=lstm|gru`) takes its state as inputs and returns the next state as outputs
(float32 [batch, memory_size]: ``state_h``, and the LSTM's ``state_c``; the report lists them). Start every
episode from zeros and feed each step's next state to the next step::

    state = {i.name: np.zeros((batch, i.shape[1]), np.float32) for i in session.get_inputs() if i.name != "obs"}
    action, *next_state = session.run(None, {"obs": obs, **state})
    state = {name: np.where(done[:, None], 0.0, s).astype(np.float32)    # zeros where an episode ended
             for name, s in zip(state, next_state)}

The graph is the run's whole deterministic action, the one `sparqrl.load(run_dir).act` and evaluation
take: PPO's observation normalisation (its saved running statistics), the network (MLP or MinAtar
Conv torso), and the head (argmax -> int32 [batch]; for continuous actions tanh and scaling to the
env's bounds, or PPO's clipping, -> float32 [batch, |A|]). Every algorithm (ppo, impala, a2c, dqn, td3, sac) on
both runners exports; sparse runs (RLx2) store their pruned kernels compactly (`graph`: a bitmap and
the kept values, rebuilt at session load) and the report gives the bytes of both encodings.

Python API::

    export(run_dir, out, precision="fp32", seed=0, sparse="auto", overwrite=False) -> report dict
    export_policy(policy, out, precision, ...) -> report     # a `policy.Policy` built by `describe`

Before anything is written the fp32 graph (same weight encoding) is run with ONNX Runtime on random
observations and compared with the library's own action (`check`; a recurrent policy's actions and states over
`CHECK_STEPS` steps): a network the exporter reads wrongly is an error, never a silently wrong file.

How the graph is built (chosen over ``jax2onnx``): directly with ``onnx.helper`` from the policy's
parameters (`policy.describe`), the pre/post-processing as ONNX nodes. jax2onnx 0.17.1 would install
without moving the jax / onnx / onnxruntime pins, but brings about 20 more packages (orbax-export,
equinox, huggingface_hub, netron, ...) to trace what are 5-15 nodes here, and its graphs would still
need rewriting for the int8 weight encoding and the compact sparse kernels, which are the point of this
exporter. int8 reuses `sparqrl.quant`'s per-channel quantization rather than
``onnxruntime.quantization.quantize_dynamic``, whose default 7-bit weights (``reduce_range``) double
the weight error to avoid a saturation that the uint8 encoding here avoids exactly (`graph`).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from sparqrl import config as cfg
from sparqrl.argparsing import OneLineParser, add_import_flag
from sparqrl.export.policy import Policy, Reference, describe, load_policy, unexportable
from sparqrl.trust import Trust, named

FORMATS = ("onnx",)
PRECISIONS = ("fp32", "fp16", "int8")
SPARSE = ("auto", "no")
CHECK_OBSERVATIONS = 256
WHAT = "sparqrl export"

__all__ = ["FORMATS", "PRECISIONS", "SPARSE", "Policy", "check", "describe", "export", "export_policy",
           "load_policy", "run_cli", "session"]


def _need_onnx() -> None:
    from sparqrl.extras import need

    need("onnx", WHAT)
    need("onnxruntime", WHAT)


def _check_out(out: str | Path, overwrite: bool) -> Path:
    path = Path(out)
    cfg.require(str(out) != "", "out", out, "must name the file to write (e.g. policy.onnx)")
    cfg.require(not path.is_dir(), "out", str(out), "is a folder; name the file to write (e.g. policy.onnx)")
    cfg.require(overwrite or not path.exists(), "out", str(out),
                "already exists; pass --overwrite (overwrite=True) to replace it")
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    cfg.require(parent is not None and parent.is_dir(), "out", str(out), f"cannot be written: {parent} is not a folder")
    return path


def check_args(precision: str, fmt: str = "onnx", sparse: str = "auto") -> None:
    cfg.one_of("format", fmt, FORMATS)
    cfg.one_of("precision", precision, PRECISIONS)
    cfg.one_of("sparse", sparse, SPARSE)


def session(model: bytes | str | Path, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session of an exported policy on `threads` threads (what `check` and the
    benchmark run; any session options work on the file)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _observations(policy: Policy, count: int, seed: int = 0) -> np.ndarray:
    """Random observations [count, *obs_shape]: standard normal, or in the normaliser's frame (mean +
    std · normal) where the policy normalises, so the network sees its usual range."""
    x = np.random.default_rng(seed).normal(size=(count, *policy.obs_shape)).astype(np.float32)
    if policy.obs_norm is not None:
        x = policy.obs_norm.mean + policy.obs_norm.std * x
    return x.astype(np.float32)


def check(model: bytes, policy: Policy, reference: Reference, count: int = CHECK_OBSERVATIONS) -> dict[str, float]:
    """Run the (fp32) `model` on `count` random observations against the library's `reference` action.
    Discrete: at least 99 % equal actions (ties aside, fp32 agrees exactly); continuous: max |error| <=
    1e-4 · (1 + |action|). A recurrent policy: `CHECK_STEPS` steps of `count` episodes from the zero state, each
    side carrying its own state, the states too within 1e-4 · (1 + |state|). A one-line ConfigError otherwise."""
    if policy.cell is not None:
        return check_recurrent(model, policy, reference, count)
    obs = _observations(policy, count)
    got = session(model).run(None, {"obs": obs})[0]
    return _compare(policy, got, np.asarray(reference(obs)), count)


CHECK_STEPS = 8
"""Steps a recurrent policy's graph is run against the library's (`check`)."""


def check_recurrent(model: bytes, policy: Policy, reference: Reference, count: int = CHECK_OBSERVATIONS
                    ) -> dict[str, float]:
    """`check` of a recurrent policy: actions and states step by step (see there)."""
    from sparqrl.export.graph import state_names

    run = session(model)
    names = state_names(policy)
    zeros = np.zeros((count, policy.cell.size), np.float32)
    got_state = {name: zeros for name, _ in names}
    want_state = tuple(zeros for _ in names) if len(names) > 1 else zeros  # flax's carry: (c, h) or h
    reports, state_error = [], 0.0
    for step in range(CHECK_STEPS):
        obs = _observations(policy, count, seed=step)
        action, *state = run.run(None, {"obs": obs, **got_state})
        want_action, want_state = reference(obs, want_state)
        reports.append(_compare(policy, action, np.asarray(want_action), count))
        for got, want in zip(state, carry_arrays(want_state)):
            state_error = max(state_error, float(np.max(np.abs(got - want) / (1.0 + np.abs(want)))))
        got_state = dict(zip((name for name, _ in names), state))
    if state_error > 1e-4:
        unexportable("policy", f"the ONNX graph's recurrent states differ from the library's by up to "
                               f"{state_error:.2g} (relative) over {CHECK_STEPS} steps (a network the exporter "
                               "misreads)")
    worst = ({"agreement": min(r["agreement"] for r in reports)} if policy.head.discrete
             else {"max_relative_error": max(r["max_relative_error"] for r in reports)})
    return {"observations": count, "steps": CHECK_STEPS, **worst, "max_state_relative_error": state_error}


def carry_arrays(carry: Any) -> list[np.ndarray]:
    """A flax carry's arrays in its order ((c, h) or h)."""
    return [np.asarray(x) for x in (carry if isinstance(carry, tuple) else (carry,))]


def _compare(policy: Policy, got: np.ndarray, want: np.ndarray, count: int) -> dict[str, float]:
    """`check`'s comparison of the graph's actions `got` with the library's `want`."""
    if got.shape != want.shape:
        unexportable("policy", f"the graph's actions have shape {got.shape}, the library's {want.shape}")
    if policy.head.discrete:
        agreement = float(np.mean(got == want))
        if agreement < 0.99:
            unexportable("policy", f"the ONNX graph's actions equal the library's on {agreement:.1%} of {count} "
                                   "observations (a network the exporter misreads)")
        return {"observations": count, "agreement": agreement}
    error = float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
    if error > 1e-4:
        unexportable("policy", f"the ONNX graph's actions differ from the library's by up to {error:.2g} "
                               f"(relative) on {count} observations (a network the exporter misreads)")
    return {"observations": count, "max_relative_error": error}


def _write(path: Path, data: bytes) -> None:
    """Write atomically: a partial file never takes the place of the output. The file gets the user's default
    mode (0o666 less their umask), as any file they write: a policy is made to be shared, and mkstemp's 0600
    would hide it from the group that shares it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)  # the kernel applies the umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_policy(policy: Policy, out: str | Path | None, precision: str = "fp32", *, sparse: str = "auto",
                  overwrite: bool = False, reference: Reference | None = None,
                  metadata: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """Build `policy` at `precision`, check it against `reference` (if given) and write it to `out` (None:
    write nothing). Returns (the serialized model, the report)."""
    from sparqrl.export.graph import build_model, output_info

    check_args(precision, "onnx", sparse)
    _need_onnx()
    path = None if out is None else _check_out(out, overwrite)
    compact = sparse == "auto"
    fp32, fp32_compact = build_model(policy, "fp32", compact, metadata)
    fp32_bytes = fp32.SerializeToString()
    checked = check(fp32_bytes, policy, reference) if reference is not None else None
    if precision == "fp32":
        data, compact_tensors = fp32_bytes, fp32_compact
    else:
        model, compact_tensors = build_model(policy, precision, compact, metadata)
        data = model.SerializeToString()
    report: dict[str, Any] = {
        "path": None if path is None else str(path), "bytes": len(data), "format": "onnx", "precision": precision,
        "sparse": compact_tensors > 0, "compact_tensors": compact_tensors,
    }
    if compact_tensors:
        report["dense_bytes"] = build_model(policy, precision, False, metadata)[0].ByteSize()
    report.update(output_info(policy))
    if checked is not None:
        report["check_fp32"] = checked
    if path is not None:
        _write(path, data)
    return data, report


def export(run_dir: str | Path, out: str | Path, precision: str = "fp32", *, seed: int = 0, fmt: str = "onnx",
           sparse: str = "auto", overwrite: bool = False, trust_imports: bool | Trust = False) -> dict[str, Any]:
    """Export seed `seed`'s deterministic policy of the run in `run_dir` to `out`; returns the report
    (path, bytes, precision, format, seed, sparse, inputs/outputs, ...). Every argument is checked
    (ConfigError) before anything is compiled or written; an existing `out` is replaced only with
    `overwrite`. trust_imports: as `sparqrl.load`'s (a run folder is data, see `sparqrl.trust`)."""
    check_args(precision, fmt, sparse)
    _need_onnx()
    _check_out(out, overwrite)
    policy, reference, info = load_policy(run_dir, seed, trust_imports)
    metadata = {"producer": "sparqrl", "algo": info.algo, "env": info.env, "seed": seed, "precision": precision,
                "run_sparse": info.sparse, "obs_shape": json.dumps(list(policy.obs_shape))}
    _, report = export_policy(policy, out, precision, sparse=sparse, overwrite=overwrite, reference=reference,
                              metadata=metadata)
    return {**report, "seed": seed, "algo": info.algo, "env": info.env, "run_sparse": info.sparse}


def run_cli(argv: list[str]) -> int:
    """`sparqrl export ...`: prints the report as JSON."""
    parser = OneLineParser(prog="sparqrl export", description="Write a run's deterministic policy as a "
                           "self-contained ONNX file (runs in ONNX Runtime without sparqrl).")
    parser.add_argument("dir", help="output directory of a run")
    parser.add_argument("--format", default="onnx", help="file format: onnx (default)")
    parser.add_argument("--precision", default="fp32", help="fp32 (default), fp16 or int8 (per-channel weights, "
                        "dynamically quantized activations)")
    parser.add_argument("--seed", type=int, default=0, help="which trained policy of the run (default 0)")
    parser.add_argument("--sparse", default="auto", help="auto (default): store pruned kernels compactly where "
                        "that is smaller; no: every kernel dense")
    parser.add_argument("--out", required=True, help="the file to write, e.g. policy.onnx")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_import_flag(parser)
    args = parser.parse_args(argv)
    report = export(args.dir, args.out, args.precision, seed=args.seed, fmt=args.format, sparse=args.sparse,
                    overwrite=args.overwrite, trust_imports=named(args.imports))
    print(json.dumps(report, indent=2))
    return 0
