"""Content fingerprints of models and keys of input items, for job manifests.

`fingerprint(path)` hashes what a file or a folder holds, not where it lives: moving a model folder keeps its
fingerprint, retraining it in place changes it. Files up to `FULL_HASH_BYTES` (64 MiB: configs, tokenizers,
small models) are hashed byte for byte (sha256). Larger files, where reading every byte would cost seconds per
gigabyte, are hashed cheaply: their size, their safetensors header (tensor names, dtypes, shapes, offsets) when
they are safetensors files, and `SAMPLES` blocks of 1 MiB spread evenly over the file (the weights themselves,
so two trainings of one architecture differ). A cheap hash can miss an edit that touches no sampled block; the
full hash cannot.

Item keys: `file_key` is the resolved absolute path (so `imgs/a.png`, `./imgs/a.png` and `/abs/imgs/a.png` are
one item), `text_key` the sha256 of a prompt's text.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

FULL_HASH_BYTES = 64 << 20
SAMPLE_BYTES = 1 << 20
SAMPLES = 16


def _safetensors_header(f, size: int) -> bytes:
    head = f.read(8)
    if len(head) < 8:
        return b""
    (length,) = struct.unpack("<Q", head)
    return f.read(length) if 8 + length <= size else b""


def file_fingerprint(path: str | Path) -> str:
    """Hex digest of one file's content (full sha256 up to 64 MiB; size + header + sampled blocks above)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}\n".encode())
    with path.open("rb") as f:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        else:
            if path.suffix == ".safetensors":
                digest.update(_safetensors_header(f, size))
            for i in range(SAMPLES):
                f.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def fingerprint(path: str | Path) -> str:
    """`sha256:<hex>` of a file, or of a folder's files (relative names and contents; hidden files such as
    temporaries and locks are left out). FileNotFoundError names a missing path."""
    path = Path(path)
    if path.is_file():
        return "sha256:" + file_fingerprint(path)[:32]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest.update(f"{rel.as_posix()}\0{file_fingerprint(file)}\n".encode())
    return "sha256:" + digest.hexdigest()[:32]


def file_key(path: str | Path) -> str:
    """The key of an input file: its resolved absolute path (however the user spelled it)."""
    return str(Path(path).expanduser().resolve())


def text_key(text: str) -> str:
    """The key of a text input: sha256 of its UTF-8 bytes (32 hex digits)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


__all__ = ["FULL_HASH_BYTES", "file_fingerprint", "file_key", "fingerprint", "text_key"]
