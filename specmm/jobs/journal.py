"""JSON-lines results of a job, one record per input item, keyed: whole lines only, resumable.

Records are appended as whole lines (one `write` per batch, then flush and fsync), so after a kill the file
holds complete lines followed by at most one torn line without its newline. `load` cuts that torn tail off
(its item is simply redone) and refuses a damaged line in the middle, which no kill can produce.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from specmm.jobs.atomic import atomic_writer

logger = logging.getLogger(__name__)


class Journal:
    """Append-only `path`; every record carries its item's key in `key_field`."""

    def __init__(self, path: str | Path, key_field: str = "key", argument: str = "--out", what: str = "result"):
        self.path, self.key_field, self.argument, self.what = Path(path), key_field, argument, what
        self._file = None

    def load(self) -> dict[str, dict]:
        """{key: record} of the complete lines (later lines win); repairs a torn last line in place."""
        if not self.path.is_file():
            return {}
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        records = {}
        for number, line in enumerate(data[:end].splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = record[self.key_field]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.argument}: line {number} of {self.path} is not a {self.what} record (no "
                                 f"{self.key_field!r}); fix or remove that line, or pass --force to start "
                                 "over") from None
            records[key] = record
        if end < len(data):
            logger.warning("%s: dropping a torn last line (%d bytes) left by a killed job; its item is redone",
                           self.path, len(data) - end)
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        return records

    def append(self, records: Iterable[dict]) -> None:
        """Append records as whole lines in one write, flushed and fsynced before returning."""
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if not text:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")
        self._file.write(text.encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())

    def rewrite(self, records: Iterable[dict]) -> None:
        """Replace the file atomically by `records` (e.g. in input order once a job is complete)."""
        self.close()
        with atomic_writer(self.path, "wb") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))

    def finish(self, keys: list[str], records: dict[str, dict]) -> None:
        """End a job whose items are `keys` (input order) and whose file holds `records` in file order: rewrite the
        file in input order (records of other keys last) when it is not already, e.g. after a resume or when
        error lines went first, so a finished job's file does not depend on where it was interrupted."""
        wanted = set(keys)
        order = [k for k in keys if k in records] + [k for k in records if k not in wanted]
        if order != list(records):
            self.rewrite([records[k] for k in order])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Journal"]
