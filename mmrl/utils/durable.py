"""Durable writes: what a kill or a power loss cannot undo once the call returns; and how a failed
write tells a full disk (`disk_full`)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames and creations inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_full(exc: BaseException, folder: Path, min_free: int = 64 << 20) -> bool:
    """Whether ``exc`` (raised while writing in ``folder``) means the disk is full: ENOSPC or EDQUOT
    (safetensors' writer gives it as "(os error 28)"), or a write error of torch's serialiser ("file
    write failed", "iostream error", "unexpected pos"), which loses the errno, with less than
    ``min_free`` bytes left."""
    codes = (errno.ENOSPC, errno.EDQUOT)
    text = str(exc)
    if (isinstance(exc, OSError) and exc.errno in codes) or any(f"(os error {c})" in text for c in codes):
        return True
    if not any(s in text for s in ("write failed", "iostream", "No space left", "unexpected pos")):
        return False
    try:
        return shutil.disk_usage(folder).free < min_free
    except OSError:
        return False
