"""A job's output: locked while a run writes it, described by a manifest, resumed only by the same job.

The manifest (`<out>.job.json` next to a file output, `<out>/job.json` inside a folder output; the lock is the
hidden `.<out>.lock` or `<out>/.job.lock`) records the job kind and every setting that changes results (method,
seed, sampling, content fingerprints of the models; see `specmm.jobs.content`). Items are matched by key inside the
output, so the manifest holds no item list:
adding images to a folder and resuming does the new ones only.

The output is addressed by its real path (symlinks resolved), so two spellings of one file share one lock and
one manifest. A file output's results are the file and the part files a multi-process run writes next to it
(`.<out>.part<rank>`, see `specmm.jobs.shards`): a killed run's parts are results of that run's job.

Opening a job (`with Job(...) as job:`):
- takes the output's lock (`specmm.jobs.lock`), refusing a second concurrent run;
- an output without results (missing, an empty file and no parts, a folder without the job's files) starts fresh;
- with results: `force` deletes them and starts over; `resume` continues only when the stored manifest equals
  this run's (otherwise a ValueError names each setting that differs); neither is a ValueError;
- clears temporaries left by killed atomic writes, then writes this run's manifest atomically.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specmm.jobs.atomic import atomic_write_json, remove_temporaries
from specmm.jobs.lock import OutputLock

logger = logging.getLogger(__name__)

FORMAT = 1


def _normal(value):
    """Settings as JSON gives them back (tuples -> lists, ...), so stored and fresh values compare equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def differences(stored: dict, current: dict) -> list[str]:
    """'name: stored -> current' for each setting that differs (missing ones shown as <unset>)."""
    out = []
    for name in sorted(set(stored) | set(current)):
        old, new = stored.get(name, "<unset>"), current.get(name, "<unset>")
        if old != new:
            out.append(f"{name}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def part_path(out: str | Path, rank: int) -> Path:
    """The part file process `rank` of a multi-process run appends to, next to the file output `out`."""
    out = Path(out)
    return out.with_name(f".{out.name}.part{rank}")


def leftover_parts(out: str | Path) -> list[Path]:
    """The part files next to the file output `out` (left by a run that was killed before merging them)."""
    out = Path(out)
    prefix = f".{out.name}.part"
    return sorted(p for p in out.parent.glob(f"{prefix}*") if p.is_file() and p.name.removeprefix(prefix).isdigit())


def _flag(argument: str, name: str) -> str:
    """How the user asks for `name` (resume, force): a CLI flag, or a keyword of the library call."""
    return f"--{name}" if argument.startswith("--") else f"{name}=True"


def check_output_path(out: str | Path, argument: str = "--out", folder: bool = False) -> Path:
    """Refuse, before any work, an output that cannot be written: a folder where a file goes (or the reverse), or
    a path under a file."""
    out = Path(out)
    if folder and out.exists() and not out.is_dir():
        raise ValueError(f"{argument}: {out} is a file, expected a folder")
    if not folder and out.is_dir():
        raise ValueError(f"{argument}: {out} is a folder, expected a file")
    parent = next((p for p in Path(os.path.abspath(out)).parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{argument}: {out} cannot be written: {parent} is a file, not a folder")
    probe_at = out if folder and out.is_dir() else parent
    if probe_at is not None:
        try:  # a real write: permission bits say nothing to root, nor about read-only or virtual file systems
            tempfile.TemporaryFile(dir=probe_at).close()
        except OSError as err:
            raise ValueError(f"{argument}: {out} cannot be written ({probe_at}: {err.strerror or err})") from None
    return out


def check_file_output(out: str | Path, resume: bool, force: bool, argument: str = "--out") -> Path:
    """Refuse, before any model loads, a file output that cannot be written or that holds results (the file or
    a killed run's part files) while neither `resume` nor `force` is given."""
    out = check_output_path(out, argument)
    if resume or force:
        return out
    how = f"resume it ({_flag(argument, 'resume')}), start over ({_flag(argument, 'force')}) or choose another file"
    if out.is_file() and out.stat().st_size > 0:
        raise ValueError(f"{argument}: {out} exists and is not empty; {how}")
    if leftover_parts(out):
        raise ValueError(f"{argument}: {out} has part files of an interrupted multi-process run next to it; {how}")
    return out


class Job:
    """One run writing `out` (a file, or a folder when `folder=True`) for job `kind` with `settings`.

    `owned`: glob patterns of the files a folder job writes (what `force` deletes and what counts as results).
    `argument`: the CLI argument naming the output, used in every message (which show `out` as given).
    """

    def __init__(self, out: str | Path, kind: str, settings: dict, *, resume: bool = False, force: bool = False,
                 folder: bool = False, owned: Sequence[str] = (), argument: str = "--out"):
        self.shown, self.kind, self.settings = Path(out), kind, _normal(settings)
        self.out = Path(os.path.realpath(out))  # one lock and manifest however the output is spelled
        self.resume, self.force, self.folder, self.owned, self.argument = resume, force, folder, tuple(owned), argument
        if folder:
            self.manifest_path, lock_path = self.out / "job.json", self.out / ".job.lock"
        else:
            self.manifest_path = self.out.with_name(self.out.name + ".job.json")
            lock_path = self.out.with_name(f".{self.out.name}.lock")
        self.lock = OutputLock(lock_path, argument, self.shown)
        self.resumed = False

    # ------------------------------------------------------------------ what is there
    def result_files(self) -> list[Path]:
        if not self.folder:
            whole = [self.out] if self.out.is_file() and self.out.stat().st_size > 0 else []
            return whole + leftover_parts(self.out)
        return sorted({p for pattern in self.owned for p in self.out.glob(pattern) if p.is_file()})

    def stored_manifest(self) -> dict | None:
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------------ open / close
    def __enter__(self) -> Job:
        check_output_path(self.shown, self.argument, self.folder)
        if self.folder:
            self.out.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._open()
        except BaseException:
            self.lock.release()
            raise
        return self

    def _open(self) -> None:
        results = self.result_files()
        resume, force = _flag(self.argument, "resume"), _flag(self.argument, "force")
        if results and self.force:
            logger.warning("%s: --force: deleting %d result file(s) of the previous job", self.shown, len(results))
            for path in results:
                path.unlink()
        elif results and not self.resume:
            raise ValueError(f"{self.argument}: {self.shown} already holds results; pass {resume} to continue that "
                             f"job, {force} to start over, or choose another output")
        elif results:
            stored = self.stored_manifest()
            if stored is None:
                raise ValueError(f"{self.argument}: {self.shown} holds results but no readable job manifest "
                                 f"({self.manifest_path}; written by an older specmm or by hand), so resuming could "
                                 f"mix different work; pass {force} to start over or choose another "
                                 "output")
            found = differences({"job": stored.get("job"), **stored.get("settings", {})},
                                {"job": self.kind, **self.settings})
            if found:
                raise ValueError(f"{self.argument}: {self.shown} holds a different job ({'; '.join(found)}); resume it "
                                 f"with its own arguments, pass {force} to start over, or choose "
                                 "another output")
            self.resumed = True
        remove_temporaries(self.out if self.folder else self.out.parent,
                           "" if self.folder else self.out.name)
        atomic_write_json(self.manifest_path, {"job": self.kind, "format": FORMAT, "settings": self.settings})

    def __exit__(self, *exc) -> None:
        self.lock.release()


__all__ = ["Job", "check_file_output", "check_output_path", "differences", "leftover_parts", "part_path"]
