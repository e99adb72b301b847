"""The traced-program store (`sparqrl.runners.programs`): a second build of the same program loads it and
computes the same thing; another description, a damaged entry or a function jax.export cannot hold
never gives a wrong program; an entry is data (no pickle), and another user's entry is not used."""

import json
import pickle
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from sparqrl.runners.programs import TreeNotDescribable, build_program, describe_tree, rebuild_tree


def step(state, n):
    """A pytree in, a pytree out (a dict and a tuple), like a chunk program."""
    params, count = state
    params = jax.tree.map(lambda p: p * 0.5 + n, params)
    return (params, count + 1), {"norm": sum(jnp.sum(p**2) for p in jax.tree.leaves(params))}


STATE = ({"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}, jnp.int32(0))


def run(program):
    out = program(STATE, jnp.float32(2.0))
    return [np.asarray(x) for x in jax.tree.leaves(out)], jax.tree.structure(out)


def test_a_stored_program_is_loaded_and_computes_the_same(tmp_path):
    first = build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    second = build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    assert not first.loaded and second.loaded and len(list(tmp_path.iterdir())) == 1
    uncached = build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=None)
    (a, tree_a), (b, tree_b), (c, tree_c) = run(first), run(second), run(uncached)
    expected, tree = run(lambda *args: jax.jit(step)(*args))
    assert tree_a == tree_b == tree_c == tree and not uncached.loaded
    for x, y, u, z in zip(a, b, c, expected, strict=True):
        for got in (x, y, u):
            np.testing.assert_array_equal(got, z)
    assert jax.tree.structure(second.out_info) == tree
    assert [s.shape for s in jax.tree.leaves(second.out_info)] == [x.shape for x in expected]


def test_another_description_or_shape_is_another_program(tmp_path):
    build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    assert not build_program("step", step, (STATE, jnp.float32(1.0)), describe="b", store=tmp_path).loaded
    wider = ({"w": jnp.zeros((2, 4)), "b": jnp.ones(4)}, jnp.int32(0))
    assert not build_program("step", step, (wider, jnp.float32(1.0)), describe="a", store=tmp_path).loaded
    assert len(list(tmp_path.iterdir())) == 3


def test_a_damaged_entry_is_rebuilt(tmp_path):
    build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # cut short, as by a full disk
    rebuilt = build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    assert not rebuilt.loaded
    np.testing.assert_array_equal(run(rebuilt)[0][0], run(lambda *a: jax.jit(step)(*a))[0][0])
    assert build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path).loaded


def test_a_host_callback_is_compiled_directly_and_not_stored(tmp_path):
    def with_callback(x):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

    program = build_program("callback", with_callback, (jnp.ones(3),), describe="a", store=tmp_path)
    np.testing.assert_array_equal(np.asarray(program(jnp.ones(3))), np.full(3, 3.0))
    assert not program.loaded and not list(tmp_path.iterdir())


class _Payload:
    """Unpickling this creates `marker`: what a planted pickle in the cache folder would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_does_not_run_and_is_rebuilt(tmp_path):
    store, marker = tmp_path / "store", tmp_path / "marker"
    build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=store)
    (entry,) = store.iterdir()
    entry.write_bytes(pickle.dumps({"exported": _Payload(marker), "out_tree": _Payload(marker)}))
    rebuilt = build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=store)
    assert not marker.exists() and not rebuilt.loaded
    assert build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=store).loaded


def test_another_users_entry_is_passed_over_and_kept(tmp_path, monkeypatch):
    build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path)
    (entry,) = tmp_path.iterdir()
    monkeypatch.setattr("os.getuid", lambda: entry.stat().st_uid + 1)  # the entry is now someone else's
    assert not build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path).loaded
    entry.write_bytes(entry.read_bytes()[:100])  # damaged, and not ours: not deleted
    assert not build_program("step", step, (STATE, jnp.float32(1.0)), describe="a", store=tmp_path).loaded
    assert entry.exists()


class _Pair(NamedTuple):
    a: object
    b: object


@struct.dataclass
class _Static:
    x: object
    kind: tuple = struct.field(pytree_node=False, default=("a", 1))


def test_out_trees_are_stored_as_data():
    """None, named tuples and a flax dataclass's static fields go through JSON; node types are looked up
    among the imported modules, never imported; a local class is not described (its program not stored)."""
    tree = jax.tree.structure((STATE, None, _Pair(1, [2]), _Static(3), {7: ()}))
    assert rebuild_tree(json.loads(json.dumps(describe_tree(tree)))) == tree

    class Local(NamedTuple):
        a: object

    with pytest.raises(TreeNotDescribable):
        describe_tree(jax.tree.structure(Local(1)))
    with pytest.raises(TreeNotDescribable):
        rebuild_tree(["no_such_module_xyz:Thing", None, []])
