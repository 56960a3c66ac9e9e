"""A JSON-lines job spread over the processes of `accelerate launch` (one process when not launched).

- Every process runs `accelerate.PartialState`; the job's batches (fixed slices, `specmm.jobs.plan`) are split
  between processes by position with `split_between_processes`, so which process runs an item depends on the
  input order only, never on timing.
- Only the main process holds the output's lock and manifest (`specmm.jobs.job`). With several processes each one
  appends its records to its own part file (the hidden `.<out>.part<rank>`), and the main process merges the parts
  into the output, in input order, once every process is done: the lines a single-process run writes.
- Part files left by a killed run (any process count) are results of that run's job (`Job` counts them): a rerun
  without --resume or --force is refused, --force deletes them, and --resume (the same job only) merges them into
  the output before anything new is written, so items match by key whatever the process count was.
- A process that raises logs its rank before it dies; `accelerate launch` (torch elastic) then stops the others
  and fails the job naming the failed rank.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specmm.jobs.job import Job, leftover_parts, part_path
from specmm.jobs.journal import Journal

logger = logging.getLogger(__name__)
_closing_registered = False


class Processes:
    """This process's place among the job's processes, through accelerate's `PartialState` (`cpu=True` runs
    gloo between CPU processes)."""

    def __init__(self, cpu: bool = True):
        from accelerate import PartialState

        self.state = PartialState(cpu=cpu)
        global _closing_registered
        if self.state.num_processes > 1 and not _closing_registered:  # one process group per process, closed at exit
            atexit.register(self.state.destroy_process_group)  # as accelerate asks: a live group can abort the exit
            _closing_registered = True

    @property
    def rank(self) -> int:
        return self.state.process_index

    @property
    def size(self) -> int:
        return self.state.num_processes

    @property
    def is_main(self) -> bool:
        return self.state.is_main_process

    def barrier(self) -> None:
        self.state.wait_for_everyone()

    def share(self, value):
        """The main process's `value`, on every process."""
        if self.size == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def gather(self, value) -> list:
        """Every process's `value`, by rank, on every process."""
        if self.size == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def my_share(self, batches: Sequence) -> list:
        """This process's contiguous share of `batches` (by position only)."""
        with self.state.split_between_processes(list(batches)) as mine:
            return list(mine)


def process_device(device: str):
    """This process's device: under `accelerate launch`, a bare "cuda" is the GPU of this process's local rank
    (cuda:LOCAL_RANK), so the processes of a node do not all load onto GPU 0; anything else as given."""
    import torch

    device = torch.device(device)
    rank = os.environ.get("LOCAL_RANK")
    if device.type == "cuda" and device.index is None and rank is not None:
        return torch.device("cuda", int(rank))
    return device


def _open_on_main(job: Job, processes: Processes) -> None:
    """Open `job` (lock, manifest, resume decision) on the main process; its refusal is raised on every process."""
    problem = None
    if processes.is_main:
        try:
            job.__enter__()
        except BaseException as err:
            problem = err
    message = processes.share(None if problem is None else f"{type(problem).__name__}: {problem}")
    if problem is not None:
        raise problem
    if message is not None:
        raise ValueError(f"the main process could not open the job: {message}")


def _log_failure(processes: Processes, err: BaseException) -> None:
    if processes.size > 1:
        logger.error("rank %d of %d failed: %s: %s; what it finished is kept, rerun with --resume to finish",
                     processes.rank, processes.size, type(err).__name__, err)


@contextmanager
def shared_job(job: Job, processes: Processes) -> Iterator[Job]:
    """A job whose items are files of their own (an image folder): opened on the main process only, every process
    writing its items; the caller shares the plan from the main process and waits for all before finishing."""
    _open_on_main(job, processes)
    try:
        yield job
    except BaseException as err:
        _log_failure(processes, err)
        raise
    finally:
        if processes.is_main:
            job.__exit__(None, None, None)


class ShardedJournal:
    """The output journal of `job` shared by `processes`: `done_keys` on every process, `append` to this process's
    file, `finish(keys)` merges on the main process. Use as a context manager around the whole run."""

    def __init__(self, job: Job, key_field: str, processes: Processes, what: str = "result"):
        self.job, self.key_field, self.processes, self.what = job, key_field, processes, what
        self.output = Journal(job.out, key_field=key_field, argument=job.argument, what=what)
        self.done: dict[str, dict] = {}  # the main process's records (other processes know the keys only)
        self.done_keys: set[str] = set()
        self._part: Journal | None = None
        self._opened = False

    def _journal(self, path: Path) -> Journal:
        return Journal(path, key_field=self.key_field, argument=self.job.argument, what=self.what)

    def _fold_parts(self) -> bool:
        """Merge part files into `self.done` and delete them; True when there were any."""
        parts = leftover_parts(self.job.out)
        for part in parts:
            self.done.update(self._journal(part).load())
        return bool(parts)

    def __enter__(self) -> ShardedJournal:
        problem = None
        if self.processes.is_main:
            try:
                self.job.__enter__()
                self._opened = True
                self.done = self.output.load()
                if self._fold_parts():  # a killed run's parts: into the output before anything new is written
                    self.output.rewrite(self.done.values())
                    for part in leftover_parts(self.job.out):
                        part.unlink()
            except BaseException as err:
                problem = err
        message = self.processes.share(None if problem is None else f"{type(problem).__name__}: {problem}")
        if problem is not None:
            self._close()
            raise problem
        if message is not None:
            raise ValueError(f"the main process could not open the job: {message}")
        self.done_keys = set(self.processes.share(sorted(self.done)))
        if self.processes.size > 1:
            self._part = self._journal(part_path(self.job.out, self.processes.rank))
        else:
            self._part = self.output
        return self

    def append(self, records: list[dict]) -> None:
        self._part.append(records)
        self.done_keys.update(r[self.key_field] for r in records)
        if self._part is self.output:
            self.done.update((r[self.key_field], r) for r in records)

    def written(self) -> int:
        """Records this run has written so far, over every process (line counts of the part files)."""
        if self.processes.size == 1:
            return 0
        return sum(p.read_bytes().count(b"\n") for p in leftover_parts(self.job.out))

    def finish(self, keys: list[str]) -> None:
        """Wait for every process, then (main) write the output in input order and delete the parts."""
        self._part.close()
        self.processes.barrier()
        if not self.processes.is_main:
            return
        if self.processes.size > 1 and self._fold_parts():
            wanted = set(keys)
            order = [k for k in keys if k in self.done] + [k for k in self.done if k not in wanted]
            self.output.rewrite([self.done[k] for k in order])
            for part in leftover_parts(self.job.out):
                part.unlink()
        else:
            self.output.finish(keys, self.done)

    def _close(self) -> None:
        if self._part is not None:
            self._part.close()
        self.output.close()
        if self._opened:
            self._opened = False
            self.job.__exit__(None, None, None)

    def __exit__(self, kind, err, trace) -> None:
        if err is not None and self.processes.size > 1:
            logger.error("rank %d of %d failed: %s: %s; what it finished is kept, rerun with --resume to finish",
                         self.processes.rank, self.processes.size, kind.__name__, err)
        self._close()


__all__ = ["Processes", "ShardedJournal", "leftover_parts", "part_path", "process_device"]
