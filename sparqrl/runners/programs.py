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

An entry is data, never code: whoever can write the cache folder must not run code in a later run. So no
pickle: an entry is a JSON header (the format and the result's pytree structure, `describe_tree`) and
jax.export's own serialization. The structure names its node types, which are looked up among the modules
this process has already imported (`rebuild_tree`), never imported. An entry that is damaged, of another
format or not owned by this user is passed over (a damaged one of ours is rebuilt in place).

Why our own layer: neither JAX nor flax keeps traced programs across processes (the persistent cache
is keyed by the lowered HLO, so it needs the lowering it would save).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable

import jax
from jax import export

FORMAT = 2
"""Bump when what a stored entry holds changes."""

# the libraries whose code is traced into a program (besides sparqrl's own source, hashed file by file)
TRACED_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "gymnax", "brax", "mujoco-mjx", "numpy")


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


CPU_TRAINING = {"xla_backend_optimization_level": 2}
"""XLA options for a CPU program that trains (the chunk program): LLVM's default optimisation (O2) instead of XLA's
aggressive one (O3): PPO CartPole's chunk program compiled with 15-25 % less CPU on the 2-core machine, ran as fast
and gave the same bits (issue 33); level 1 ran slower at 8 seeds, level 0 changed the results."""


def training_options() -> dict[str, Any] | None:
    """Compiler options for a program that trains: `CPU_TRAINING` on the CPU, XLA's defaults elsewhere."""
    return dict(CPU_TRAINING) if jax.default_backend() == "cpu" else None


def run_once_options() -> dict[str, Any] | None:
    """Compiler options for a program that runs once: `CPU_RUN_ONCE` on the CPU, XLA's defaults elsewhere."""
    return dict(CPU_RUN_ONCE) if jax.default_backend() == "cpu" else None


def build_program(name: str, fn: Callable, args: tuple, *, describe: str, store: Path | None,
                  compiler_options: dict[str, Any] | None = None,
                  on_compile: Callable[[], None] | None = None,
                  on_lowered: Callable[[], None] | None = None) -> Program:
    """Compile `fn(*args)` (`args`: arrays or ShapeDtypeStructs with shardings), loading its traced form
    from `store` when an earlier run stored it under the same key, and storing it otherwise. `describe`
    must say everything `fn` closes over (algorithm, its config, env, ...); `store=None` caches nothing.
    `compiler_options`: XLA's, for this program (e.g. `run_once_options()`). `on_compile()`: called before
    a program the store does not hold is traced and compiled (XLA's cache cannot hold it either: both
    keep what the first run of a configuration built), so that a long first compile can be said. `on_lowered()`:
    called once tracing and lowering are done, before XLA compiles (which releases the GIL: other Python work
    started there runs beside the compile instead of slowing the tracing)."""
    leaves, in_tree = jax.tree.flatten(args)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)) for x in leaves]
    path = None if store is None else store / f"{name}-{_key(name, describe, specs, in_tree)}.jaxprogram"
    entry = _load(path) if path is not None else None
    loaded = entry is not None
    if entry is None:
        if on_compile is not None:
            on_compile()
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
            lowered = jitted.lower(*specs)
            if on_lowered is not None:
                on_lowered()
            compiled = lowered.compile(compiler_options)
            return Program(compiled, out_trees[-1], _out_info(out_trees[-1], compiled.out_info,
                                                              compiled.output_shardings), loaded=False)
        entry = exported, out_trees[-1]
        _save(path, entry)  # (an out tree `describe_tree` cannot hold is not stored)
    exported, out_tree = entry
    lowered = jax.jit(exported.call).lower(*specs)
    if on_lowered is not None:
        on_lowered()
    compiled = lowered.compile(compiler_options)
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


MAGIC = b"sparqrl-program\n"
"""The first bytes of an entry; then one line of JSON (format, out tree), then jax.export's bytes."""


def _load(path: Path) -> tuple[Any, Any] | None:
    """The entry at `path`, or None: missing, not a regular file of this user's (left as it is), or damaged
    or of another format (ours: deleted, so that it is stored again)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # missing, a symlink, unreadable
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
            return None  # another user's entry is not trusted, nor deleted
        try:
            data = file.read()
            header, _, serialized = data.removeprefix(MAGIC).partition(b"\n")
            meta = json.loads(header)
            if not data.startswith(MAGIC) or meta["format"] != FORMAT:
                raise ValueError("another format")
            exported = export.deserialize(bytearray(serialized))
            out_tree = rebuild_tree(meta["out_tree"])
            if out_tree.num_leaves != len(exported.out_avals):
                raise ValueError("the out tree does not match the program")
            return exported, out_tree
        except Exception:  # noqa: BLE001 - a damaged entry (cut short, another format) is rebuilt
            with contextlib.suppress(OSError):  # (an unreadable cache folder only costs the time to rebuild)
                path.unlink()
            return None


def _save(path: Path, entry: tuple[Any, Any]) -> None:
    exported, out_tree = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        header = json.dumps({"format": FORMAT, "out_tree": describe_tree(out_tree)}).encode()
        data = MAGIC + header + b"\n" + bytes(exported.serialize())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)  # whole or not at all: runs side by side may store the same entry
    except Exception:  # noqa: BLE001 - a cache that cannot be written (full disk, read-only), or an out tree
        with contextlib.suppress(OSError):  # describe_tree cannot hold, costs only time
            tmp.unlink()


NONE_TYPE = "builtins:NoneType"
"""None's node type, which no module holds as an attribute."""


class TreeNotDescribable(ValueError):
    """A pytree node whose type or static data `describe_tree` cannot write as JSON."""


def describe_tree(tree: Any) -> Any:
    """A pytree structure as JSON: "*" for a leaf, else [node type "module:qualname", static data, children].
    Static data (a dict's keys, a flax dataclass's static fields) must be None, numbers, strings, or lists or
    tuples of them; anything else raises `TreeNotDescribable`."""
    node = tree.node_data()
    if node is None:
        return "*"
    kind, aux = node
    name = f"{kind.__module__}:{kind.__qualname__}"
    if "<" in name:  # a local class: no name to find it by
        raise TreeNotDescribable(name)
    return [name, _describe_aux(aux), [describe_tree(child) for child in tree.children()]]


def rebuild_tree(description: Any) -> Any:
    """The pytree structure `describe_tree` described. A node type is looked up in the modules this process
    has imported (none is imported); an unknown one raises `TreeNotDescribable`."""
    if description == "*":
        return jax.tree.structure(0)
    name, aux, children = description
    module, _, qualname = name.partition(":")
    kind = sys.modules.get(module) if name != NONE_TYPE else type(None)
    for part in qualname.split(".") if name != NONE_TYPE else ():
        kind = getattr(kind, part, None)
    if not isinstance(kind, type):
        raise TreeNotDescribable(name)
    return jax.tree_util.PyTreeDef.from_node_data_and_children(
        jax.tree_util.default_registry, (kind, _rebuild_aux(aux)), [rebuild_tree(c) for c in children])


def _describe_aux(aux: Any) -> Any:
    if aux is None or isinstance(aux, (bool, int, float, str)):
        return aux
    if isinstance(aux, (list, tuple)):
        return {type(aux).__name__: [_describe_aux(x) for x in aux]}
    raise TreeNotDescribable(type(aux).__name__)


def _rebuild_aux(aux: Any) -> Any:
    if isinstance(aux, dict):
        ((kind, items),) = aux.items()
        return {"list": list, "tuple": tuple}[kind](_rebuild_aux(x) for x in items)
    return aux


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
