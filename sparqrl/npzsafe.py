"""Reading a .npz file that came with a run folder without trusting it (a run folder is data from anywhere).

`np.load` inflates a member whole before its shape can be looked at, so a 4 MB file whose member unpacks
to 4 GiB is in memory before any check. `read_npz` reads the zip directory and each member's .npy header
(shape, dtype) first, lets the caller refuse them against the shapes it expects, and only then reads the
arrays: never more bytes than the accepted headers declare (a member's declared size must be exactly
its header's plus its array's, and zipfile inflates no further than the declared size). Imports nothing
heavy: meta runs and PPO's learned rules use it.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
import zlib
from typing import Callable, NamedTuple

import numpy as np

MAX_MEMBERS = 4096
"""More arrays than any file sparqrl writes holds: a directory of millions of entries is refused unread."""


class NpzError(ValueError):
    """The file is not a .npz of plain arrays, each what its header says."""


class Header(NamedTuple):
    """What a member's .npy header declares."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_npz(path: str | os.PathLike[str], check: Callable[[dict[str, Header]], None]) -> dict[str, np.ndarray]:
    """The arrays of the .npz file `path`, by name, once `check(headers)` accepted every member's header
    (it raises to refuse: a shape or dtype other than expected, a missing or extra name). Raises NpzError
    (a ValueError) for a file that is not a regular file or not a .npz of plain arrays (truncated, a
    member whose size disagrees with its header, Python objects), OSError where it cannot be read."""
    # O_NONBLOCK: a FIFO put in the folder's place would block open() forever; it is refused instead
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NpzError("not a regular file")
        try:
            with zipfile.ZipFile(file) as archive:
                headers = _headers(archive)
                check(headers)
                return {name: _array(archive, name) for name in headers}
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
            raise NpzError(f"{type(error).__name__}: {error}") from None


def _headers(archive: zipfile.ZipFile) -> dict[str, Header]:
    """Each member's header, its declared size checked against it; no array data is read."""
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise NpzError(f"holds {len(infos):,} members (at most {MAX_MEMBERS:,} are read)")
    headers: dict[str, Header] = {}
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if name == info.filename or name in headers:
            raise NpzError(f"member {info.filename!r} is not an array of its own (.npy, once)")
        with archive.open(info) as member:
            header = _header(member)
            declared = member.tell() + header.nbytes
        if info.file_size != declared:
            raise NpzError(f"member {info.filename!r} declares {info.file_size:,} bytes; its header "
                           f"({header.shape}, {header.dtype}) makes {declared:,}")
        headers[name] = header
    return headers


def _header(member: zipfile.ZipExtFile) -> Header:
    version = np.lib.format.read_magic(member)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise NpzError(f"a member is in .npy format {version}, not 1.0 or 2.0")
    shape, _fortran_order, dtype = read(member)
    if dtype.hasobject:
        raise NpzError("a member holds Python objects (they are never unpickled)")
    return Header(tuple(shape), dtype)


def _array(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    with archive.open(f"{name}.npy") as member:
        return np.lib.format.read_array(member, allow_pickle=False)
