"""Writing inside a run folder and nowhere else: no symbolic link is written through, replaced through or
followed (DESIGN.md: "a run folder is data, never code").

A run folder may come from anyone (a colleague's checkpoint, a paper's artefact), so a link in it could
point a run's writes, or orbax's clean-up of old checkpoints, at any file the user can change. What
sparqrl writes itself is opened with O_NOFOLLOW (a link there fails instead of being followed); what a
library writes (orbax, codecarbon) is checked with `check_no_links` just before the library
gets the path. This module imports nothing heavy: telemetry, runners and meta all use it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Iterable

from sparqrl.config import ConfigError


class LinkRefused(ConfigError):
    """A symbolic (or hard) link where a run would write, replace or delete: refused, nothing changed."""


def refuse_link(path: Path) -> None:
    """Raise `LinkRefused` (one line naming it) if `path` is a symbolic link, or a file with other hard
    links (written in place, it would change the file elsewhere too)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise LinkRefused(f"{path} is a symbolic link (to {os.readlink(path)}); sparqrl writes only inside a run "
                          "folder and follows no link out of it: remove the link (nothing was changed)")
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise LinkRefused(f"{path} has {info.st_nlink - 1} other hard link(s); sparqrl writes only inside a run "
                          "folder: replace it by a copy of its own (nothing was changed)")


def check_no_links(folder: Path, names: Iterable[str]) -> None:
    """Each of `names` in `folder`, and everything under those that are folders, is no link (`refuse_link`);
    `folder` itself may be one (the user named it). Folders are walked without entering links."""
    for name in names:
        path = folder / name
        refuse_link(path)
        if path.is_dir():
            for root, dirs, files in os.walk(path):  # followlinks=False: a link to a folder is listed in dirs
                for entry in (*dirs, *files):
                    refuse_link(Path(root) / entry)


def open_nofollow(path: Path, mode: str = "a", newline: str | None = "") -> IO:
    """`path` opened to write ("w": from empty, "a": at its end, "wb": bytes from empty) without following
    a symbolic link: one there fails with ELOOP (`reason` says so) instead of writing outside the folder."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, mode, newline=None if "b" in mode else newline)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a new temporary file (never one a link names) renamed over it. The
    rename replaces a link at `path` itself, never the file it points to."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a left-over, or a planted link: the link itself goes, not its target
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def reason(error: OSError) -> str:
    """A one-line reason for a failed write, e.g. 'the disk is full'."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if error.errno == errno.EROFS:
        return "the file system is read-only"
    if error.errno == errno.ELOOP:
        return "a symbolic link is in the way (sparqrl writes only inside a run folder; remove the link)"
    return error.strerror or str(error)
