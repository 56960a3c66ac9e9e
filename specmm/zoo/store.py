"""Where zoo artifacts live and how a finished build is recognised.

A build writes into `$SPECMM_HOME/zoo/<name>-<scale>/` (seed 0) or `<name>-<scale>-seed<N>/` (seed N: each seed
is its own build), keeps its checkpoints in `work/` while it runs, holds `.<folder>.lock` (one builder at a time,
released by the kernel if the builder dies), and only at the end writes `zoo.json` atomically with a manifest
(size and sha256 of every artifact file). A folder
whose `zoo.json` is missing, unreadable or disagrees with the files on disk is not a finished build: it
is rebuilt (resuming from `work/` when checkpoints are there), never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from specmm.jobs import atomic_write_text

MANIFEST = "zoo.json"
WORK = "work"


def home() -> Path:
    return Path(os.environ.get("SPECMM_HOME", Path.home() / ".cache" / "specmm")).expanduser()


def entry_dir(name: str, scale: str, seed: int = 0) -> Path:
    """The folder of one build: seed 0 keeps the plain `<name>-<scale>` name, other seeds add `-seed<N>`."""
    return home() / "zoo" / (f"{name}-{scale}" if seed == 0 else f"{name}-{scale}-seed{seed}")


def lock_path(folder: Path) -> Path:
    """The builder's lock: a hidden sibling of the build folder (inside, `force` would delete it while held)."""
    return folder.with_name(f".{folder.name}.lock")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def artifact_files(folder: Path) -> list[Path]:
    """Every file of a build but its manifest, its work/ checkpoints and temporaries of killed atomic writes."""
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.name != MANIFEST and WORK not in p.relative_to(folder).parts
                  and not (p.name.startswith(".") and p.name.endswith(".tmp")))


def write_manifest(folder: Path, record: dict) -> dict:
    """Record every artifact's size and hash, then write zoo.json atomically (the 'build finished' mark)."""
    files = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in artifact_files(folder)}
    record = {**record, "complete": True, "files": files}
    atomic_write_text(folder / MANIFEST, json.dumps(record, indent=2))
    return record


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def problems(folder: Path, check_hashes: bool = True) -> list[str]:
    """What is wrong with a build folder (empty list: a finished, intact build)."""
    record = read_manifest(folder)
    if record is None or not record.get("complete"):
        return [f"{folder / MANIFEST} missing or unreadable"]
    found = []
    on_disk = {str(p.relative_to(folder)) for p in artifact_files(folder)}
    for rel, meta in record.get("files", {}).items():
        path = folder / rel
        if rel not in on_disk:
            found.append(f"{rel} missing")
        elif path.stat().st_size != meta["bytes"]:
            found.append(f"{rel} has {path.stat().st_size} bytes, expected {meta['bytes']}")
        elif check_hashes and sha256(path) != meta["sha256"]:
            found.append(f"{rel} content changed (sha256 mismatch)")
    return found


def clear_artifacts(folder: Path) -> None:
    """Remove everything but the work/ checkpoints, so a rebuild resumes instead of starting over."""
    if not folder.exists():
        return
    for child in folder.iterdir():
        if child.name == WORK:
            continue
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
