"""`sparqrl.npzsafe`: a .npz from a run folder is checked from its headers before any array is read, in
every reader (learned rules, meta checkpoints)."""

import io
import json
import zipfile

import jax
import numpy as np
import pytest

from sparqrl import npzsafe
from sparqrl.algos.ppo import objectives as obj
from sparqrl.config import ConfigError
from sparqrl.meta import run as meta_run


@pytest.fixture
def no_array_read(monkeypatch):
    """Fails the test if any array data is read (npzsafe reads arrays with np.lib.format.read_array)."""
    read = []
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: read.append(a) or pytest.fail("array read"))
    return read


def test_a_compressed_bomb_is_refused_from_its_headers(tmp_path, no_array_read):
    """A member that unpacks to far more than the expected shape: refused unread (np.load inflated it)."""
    bomb = tmp_path / "best_meta_params.npz"
    np.savez_compressed(bomb, **{name: np.zeros((4096, 2048), np.float32) for name in ("hidden", "out")})
    assert bomb.stat().st_size < 2**20 / 4  # 64 MiB of arrays in a few hundred kB
    with pytest.raises(ConfigError, match=r"wrong shape.*hidden: \(4096, 2048\)") as error:
        obj.load_meta_params(bomb, obj.lpo_init())
    assert "\n" not in str(error.value) and not no_array_read


def _npy_header(shape, dtype=np.float32) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return out.getvalue()


@pytest.mark.parametrize("members, words", [
    ({"a.npy": _npy_header((2,)) + bytes(8) + bytes(10_000)}, "declares"),  # more bytes than its header says
    ({"a.npy": _npy_header((2,)) + bytes(8), "b.txt": b"x"}, "not an array"),
    ({"a.npy": _npy_header((2,), object) + bytes(16)}, "Python objects"),
    ({"a.npy": b"not a npy header"}, "magic"),
])
def test_members_that_are_not_what_their_headers_say_are_refused(tmp_path, no_array_read, members, words):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError, match=words):
        npzsafe.read_npz(path, lambda headers: None)
    assert not no_array_read


def test_a_checked_file_reads_whole_and_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "ok.npz"
    np.savez(path, a=np.arange(3, dtype=np.int32), b=np.ones((2, 2)))
    seen = {}
    arrays = npzsafe.read_npz(path, seen.update)
    assert seen == {"a": ((3,), np.dtype(np.int32)), "b": ((2, 2), np.dtype(np.float64))}
    np.testing.assert_array_equal(arrays["a"], np.arange(3))
    fifo = tmp_path / "fifo.npz"
    __import__("os").mkfifo(fifo)
    with pytest.raises(npzsafe.NpzError, match="regular file"):
        npzsafe.read_npz(fifo, seen.update)


def _state():
    return {"mean": np.zeros((3,), np.float32), "count": np.zeros((), np.int32)}


def _save_old_checkpoint(path, state, generation, totals):
    """checkpoint.npz as meta runs of an older sparqrl wrote it (`meta_run.convert_old_checkpoint` reads it)."""
    leaves = {f"leaf_{i:04d}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(state))}
    np.savez(path, **leaves, generation=np.asarray(generation, np.int64), totals=np.asarray(json.dumps(totals)))


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) // 2], "damaged checkpoint.npz"),  # truncated: was a BadZipFile traceback
    (lambda b: b"", "damaged checkpoint.npz"),
    ("other", "another strategy or task"),
])
def test_a_damaged_meta_checkpoint_is_one_line(tmp_path, damage, words):
    path = tmp_path / meta_run.CHECKPOINT
    _save_old_checkpoint(path, _state(), 3, {"wall_time_s": 1.0})
    state, generation, totals = meta_run.load_checkpoint(path, _state())
    assert generation == 3 and totals == {"wall_time_s": 1.0} and state["mean"].shape == (3,)
    if damage == "other":
        _save_old_checkpoint(path, {"mean": np.zeros((4,), np.float32), "count": np.zeros((), np.int32)}, 3, {})
    else:
        path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ConfigError, match=words) as error:
        meta_run.load_checkpoint(path, _state())
    assert "\n" not in str(error.value)


def test_meta_checkpoint_totals_must_be_a_small_json_mapping(tmp_path):
    path = tmp_path / meta_run.CHECKPOINT
    np.savez(path, leaf_0000=np.zeros((), np.int32), leaf_0001=np.zeros((3,), np.float32),  # count, mean
             generation=np.asarray(1), totals=np.asarray(json.dumps([1, 2])))
    with pytest.raises(ConfigError, match="damaged"):
        meta_run.load_checkpoint(path, _state())
