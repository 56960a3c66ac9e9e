"""Jobs that lose nothing and mix nothing (DESIGN principle 9): the shared machinery of every batch command.

- `atomic`: every file written under a temporary name, fsynced, renamed into place;
- `lock`: one writer per output (`fcntl.flock`, released by the kernel when the process dies);
- `content`: content fingerprints of models and keys of input items;
- `journal`: JSON-lines results keyed per item, torn last line repaired on resume;
- `job`: the manifest of what changes results, and the resume / force / refuse decision;
- `plan`: the batches a resumed job still runs (fixed slices, so it matches an uninterrupted run);
- `shards`: a job over the processes of `accelerate launch` (fixed split, a part file per process, merged by the
  main process into what one process writes).

This package imports no other specmm package, so the library, the zoo, the benchmarks and the CLI can all use it.
"""

from specmm.jobs.atomic import (
    atomic_save_image,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_writer,
    remove_temporaries,
)
from specmm.jobs.content import file_key, fingerprint, text_key
from specmm.jobs.job import Job, check_file_output, differences
from specmm.jobs.journal import Journal
from specmm.jobs.lock import JobLockedError, OutputLock
from specmm.jobs.plan import pending_batches

__all__ = ["Job", "JobLockedError", "Journal", "OutputLock", "atomic_save_image", "atomic_write_bytes",
           "atomic_write_json", "atomic_write_text", "atomic_writer", "check_file_output", "differences", "file_key",
           "fingerprint", "pending_batches", "remove_temporaries", "text_key"]
