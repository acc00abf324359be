"""Committed elastic state on disk: written atomically, so a restarted job resumes from the last commit.

The file is replaced with ``os.replace`` after the new content was written to a temporary file in the
same directory and flushed to disk, so a crash at any moment leaves either the previous checkpoint
or the new one, never a torn file.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .. import settings

#: The file name inside the checkpoint directory.
CHECKPOINT_FILE = "torchring-elastic-state.pt"
FORMAT_VERSION = 1


def resolve_checkpoint_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory commits persist to: the argument, else ``TORCHRING_CHECKPOINT_DIR``, else None."""
    if explicit is not None:
        return Path(explicit)
    value = settings.read("CHECKPOINT_DIR")
    return Path(value) if value else None


def write_checkpoint(directory: Path, snapshot: dict[str, Any], commit_count: int) -> Path:
    """Persist ``snapshot`` (handler name → saved value) to ``directory``; return the file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT_VERSION, "commits": commit_count, "time": time.time(), "state": snapshot}
    buffer = io.BytesIO()
    torch.save(payload, buffer, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    target = directory / CHECKPOINT_FILE
    fd, temporary = tempfile.mkstemp(prefix=f".{CHECKPOINT_FILE}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(buffer.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    _remove_stale_temporaries(directory)
    return target


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporary files of writers that were killed mid-write (only rank 0 writes, one commit at a time)."""
    for stale in directory.glob(f".{CHECKPOINT_FILE}.*.tmp"):
        stale.unlink(missing_ok=True)


def read_checkpoint(directory: Path) -> dict[str, Any] | None:
    """The persisted payload (``state``, ``commits``, ``time``), or None when there is no checkpoint."""
    target = directory / CHECKPOINT_FILE
    if not target.exists():
        return None
    try:
        payload = torch.load(target, weights_only=False, map_location="cpu")
    except Exception as error:
        raise RuntimeError(f"cannot read the elastic checkpoint {target}: {error}; move it away to start "
                           "from scratch") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise RuntimeError(f"{target} is not a torchring elastic checkpoint (format {FORMAT_VERSION})")
    return payload


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (not supported on every platform; best effort there)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
