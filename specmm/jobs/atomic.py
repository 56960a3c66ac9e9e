"""Atomic file writes: a reader (or a resumed job) sees the old file or the whole new one, never a torn one.

Every write goes to a temporary name in the destination's folder (same file system), is flushed and fsynced,
then renamed over the destination (`os.replace`, atomic on POSIX), and the folder entry is fsynced too. A job
killed mid-write leaves at most a `.<name>.<pid>.tmp` file, which `remove_temporaries` clears on the next run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def fsync_folder(folder: Path) -> None:
    """Persist a rename inside `folder` (no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_writer(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file next to `path`; on a clean exit it is fsynced and renamed to `path`, on an
    exception it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_writer(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_writer(path, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | Path, data: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def atomic_save_image(image, path: str | Path, format: str = "PNG") -> Path:
    """Save a PIL image atomically (`format` is explicit: the temporary name has no image suffix)."""
    with atomic_writer(path, "wb") as f:
        image.save(f, format=format)
    return Path(path)


def remove_temporaries(folder: str | Path, name_prefix: str = "") -> list[Path]:
    """Delete temporaries left in `folder` by killed atomic writes (of files whose name starts with
    `name_prefix`); returns what was removed. Call it while holding the output's lock."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob(f".{name_prefix}*{TMP_SUFFIX}") if p.is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


__all__ = ["atomic_save_image", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "atomic_writer",
           "fsync_folder", "remove_temporaries"]
