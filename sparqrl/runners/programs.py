"""Compiled programs that a later run of the same configuration loads instead of building again.

JAX's persistent compilation cache (on by default, `use_compile_cache`) skips XLA's compilation on a
second run, but not the tracing and lowering that come before it: for PPO's three programs (init,
chunk, evaluation) they take ~1.3 s of a cached start's ~1.8 s. So each program is also kept as a
serialized `jax.export.Exported` (its StableHLO, argument shapes and shardings) with the pytree
structures of its arguments and results. It is keyed by everything that decides its code: sparqrl's own
source, the versions of the libraries that trace it, JAX's numeric flags, the devices, the program's
name, the caller's description of its configuration, and its argument shapes, dtypes and shardings. A
hit skips tracing and lowering; XLA then compiles the loaded StableHLO, from the persistent cache after
the first time. Nothing else is written; a damaged or unreadable entry is rebuilt.

Why our own layer: neither JAX nor flax keeps traced programs across processes (the persistent cache
is keyed by the lowered HLO, so it needs the lowering it would save).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import pickle
from pathlib import Path
from typing import Any, Callable

import jax
from jax import export

FORMAT = 1
"""Bump when what a stored entry holds changes."""

# the libraries whose code is traced into a program (besides sparqrl's own source, hashed file by file)
TRACED_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "distrax", "gymnax", "brax", "mujoco-mjx", "numpy")


class Program:
    """A compiled program called with the same pytrees as the function it was built from."""

    def __init__(self, compiled: Any, out_tree: Any, out_info: Any, loaded: bool):
        self._compiled, self._out_tree = compiled, out_tree
        self.out_info = out_info  # the results' shapes, dtypes and shardings (a pytree of ShapeDtypeStruct)
        self.loaded = loaded  # whether it came from the store (no tracing, no lowering)

    def __call__(self, *args: Any) -> Any:
        return jax.tree.unflatten(self._out_tree, self._compiled(*jax.tree.leaves(args)))


CPU_RUN_ONCE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
"""XLA options for a CPU program that runs once (a run's init): PPO CartPole's init program compiles in 0.3 s
instead of 1.05 s and runs in 1.3 ms instead of 0.6 ms (BENCHMARKS.md, "Start fast")."""


def run_once_options() -> dict[str, Any] | None:
    """Compiler options for a program that runs once: `CPU_RUN_ONCE` on the CPU, XLA's defaults elsewhere."""
    return dict(CPU_RUN_ONCE) if jax.default_backend() == "cpu" else None


def build_program(name: str, fn: Callable, args: tuple, *, describe: str, store: Path | None,
                  compiler_options: dict[str, Any] | None = None) -> Program:
    """Compile `fn(*args)` (`args`: arrays or ShapeDtypeStructs with shardings), loading its traced form
    from `store` when an earlier run stored it under the same key, and storing it otherwise. `describe`
    must say everything `fn` closes over (algorithm, its config, env, ...); `store=None` caches nothing.
    `compiler_options`: XLA's, for this program (e.g. `run_once_options()`)."""
    leaves, in_tree = jax.tree.flatten(args)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)) for x in leaves]
    path = None if store is None else store / f"{name}-{_key(name, describe, specs, in_tree)}.jaxprogram"
    entry = _load(path) if path is not None else None
    loaded = entry is not None
    if entry is None:
        out_trees: list = []

        def flat(*xs: Any) -> list:  # leaves in, leaves out: what jax.export can serialize
            out_leaves, out_tree = jax.tree.flatten(fn(*jax.tree.unflatten(in_tree, xs)))
            out_trees.append(out_tree)
            return out_leaves

        # the arguments' shardings are kept in the program (an exported program without them expects
        # every argument replicated)
        jitted = jax.jit(flat, in_shardings=tuple(s.sharding for s in specs))
        exported = _export(jitted, specs) if path is not None else None
        if exported is None:  # nothing to store, or nothing jax.export can hold: compiled directly
            compiled = jitted.lower(*specs).compile(compiler_options)
            return Program(compiled, out_trees[-1], _out_info(out_trees[-1], compiled.out_info,
                                                              compiled.output_shardings), loaded=False)
        entry = exported, out_trees[-1]
        _save(path, entry)
    exported, out_tree = entry
    compiled = jax.jit(exported.call).lower(*specs).compile(compiler_options)
    # (the compiled program's own output shardings: the exported ones leave some unspecified)
    return Program(compiled, out_tree, _out_info(out_tree, exported.out_avals, compiled.output_shardings), loaded)


def _out_info(out_tree: Any, avals: Any, shardings: Any) -> Any:
    return jax.tree.unflatten(out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                                         for a, s in zip(jax.tree.leaves(avals), shardings)])


def _export(jitted: Any, specs: list) -> Any:
    try:
        return export.export(jitted)(*specs)
    except Exception:  # noqa: BLE001 - e.g. a host callback, which jax.export cannot serialize
        return None


def _load(path: Path) -> tuple[Any, Any] | None:
    try:
        stored = pickle.loads(path.read_bytes())
        return export.deserialize(bytearray(stored["exported"])), stored["out_tree"]
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged entry (cut short, another format) is rebuilt
        with contextlib.suppress(OSError):  # (an unreadable cache folder only costs the time to rebuild)
            path.unlink()
        return None


def _save(path: Path, entry: tuple[Any, Any]) -> None:
    exported, out_tree = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        data = pickle.dumps({"exported": bytes(exported.serialize()), "out_tree": out_tree})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)  # whole or not at all: runs side by side may store the same entry
    except Exception:  # noqa: BLE001 - a cache that cannot be written (full disk, read-only) costs only time
        with contextlib.suppress(OSError):
            tmp.unlink()


def _key(name: str, describe: str, specs: list, in_tree: Any) -> str:
    devices = sorted({f"{d.platform}:{getattr(d, 'device_kind', '')}:{d.id}" for s in specs if s.sharding is not None
                      for d in s.sharding.device_set})
    flags = {k: getattr(jax.config, k) for k in ("jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable")}
    parts = [str(FORMAT), source_digest(), name, describe, str(in_tree), str(devices), str(flags),
             os.environ.get("XLA_FLAGS", ""), *(f"{s.shape}{s.dtype}{s.sharding}" for s in specs)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


@functools.cache
def source_digest() -> str:
    """sparqrl's source files and the versions of the libraries traced into its programs."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    for library in TRACED_LIBRARIES:
        try:
            version = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{library}=={version}".encode())
    return digest.hexdigest()
