"""Side-by-side benchmarks: one process, same inputs, warm-up, device sync, median of repeats.

A benchmark is a list of `Method`s; the first is the reference for `speedup` and `outputs match`. Each method
returns the new tokens of every row (so outputs can be compared with the first method's) and, when it
speculates, its stats. Methods marked `baseline` are plain decoding: the report compares every row with the
fastest of them too. Compiled methods compile in the warm-up, whose compile seconds are reported apart; a method
with a `profile` run gets its per-round time split from one extra, untimed run. A method other than the first that
raises is reported as a failed row (its error in the table) instead of ending a long benchmark.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from specmm.bench.compile_watch import CompileWatch
from specmm.bench.report import PHASE_LABELS, BenchReport, BenchRow, compare_with_best_ar
from specmm.bench.ties import TieJudge, count_ties
from specmm.core.compiled import reset_graphs
from specmm.core.stats import GenerationStats

logger = logging.getLogger(__name__)


def distinct_ngram_share(rows: list[list[int]], n: int = 4) -> float:
    """Mean over rows of distinct n-grams / n-grams in the row's new tokens: near 0 for output that loops (every
    draft of a loop is easy), 1 for output that never repeats an n-gram. Rows shorter than n are skipped."""
    shares = [len(set(zip(*(row[i:] for i in range(n))))) / (len(row) - n + 1) for row in rows if len(row) >= n]
    return sum(shares) / len(shares) if shares else 1.0


def repetition_note(share: float, n: int = 4) -> str | None:
    """A warning for reports whose reference output repeats itself (distinct n-gram share below one half)."""
    if share >= 0.5:
        return None
    return (f"The target's own output repeats itself (distinct {n}-gram share {share:.2f}): loops are easy to draft, "
            "so speculation (prompt lookup most) gains more here than on varied text; `--no-repeat-ngram-size` "
            "(a generation_config setting every row honours) measures without loops.")


def output_repetition(outputs: dict) -> tuple[dict, list[str]]:
    """(setup entry, warning notes) for a report from its reference method's (the first) output."""
    share = distinct_ngram_share(next(iter(outputs.values())).rows)
    return {"target output: distinct 4-gram share": round(share, 3)}, [n for n in (repetition_note(share),) if n]


@dataclass
class RunResult:
    rows: list[list[int]]  # new tokens of every row, padding stripped
    mean_accepted: float | None = None  # tokens per target forward (None for non-speculative methods)
    extra: dict = field(default_factory=dict)  # method-specific columns (e.g. visual tokens seen)
    stats: GenerationStats | None = None  # specmm runs: the generation's stats (round split when profiled)
    compiled: bool | None = None  # whether the target really ran compiled (None: as the method declares)


@dataclass
class Method:
    name: str
    run: Callable[[], RunResult]
    note: str = ""
    baseline: bool = False  # plain decoding (HF generate): the bar "speedup vs best AR" measures against
    compiled: bool = False  # compiles on its first calls: needs a warm-up, which reports the compile time
    profile: Callable[[], RunResult] | None = None  # the same run with profiling on (untimed): per-round split


def round_ms(stats: GenerationStats | None) -> dict[str, float]:
    """Milliseconds per round (target forward) in each phase of a profiled generation ({} if not profiled)."""
    if stats is None or not stats.round_time_split or not stats.target_forwards:
        return {}
    return {p: 1000.0 * stats.round_time_split.get(p, 0.0) / stats.target_forwards for p in PHASE_LABELS}


def _timed(fn: Callable[[], RunResult], device: torch.device) -> tuple[float, RunResult]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


Checkpoint = Callable[[list[BenchRow], dict[str, "RunResult"]], None]


def run_benchmark(methods: list[Method], device: torch.device, *, repeats: int = 3, warmup: int = 1,
                  progress: bool = True, ties: TieJudge | None = None, checkpoint: Checkpoint | None = None
                  ) -> tuple[list[BenchRow], dict[str, RunResult]]:
    """Run every method `warmup + repeats` times (interleaved by round) and compare with the first, then run
    each method's `profile` once. Returns the table rows and each method's last timed outputs. With `ties`
    (`specmm.bench.ties`), a row whose outputs differ counts the output rows that part at a near-tie of the target.
    `checkpoint(rows, outputs)` is called after every timed round with the table so far (medians of the rounds run;
    no round split or near-tie count yet), so a caller can write a partial report that outlives a killed run."""
    if warmup < 1 and any(m.compiled for m in methods):
        raise ValueError("warmup: compiled methods compile on their first run; give at least one warm-up run")
    timings: dict[str, list[float]] = {m.name: [] for m in methods}
    watches = {m.name: (CompileWatch(), CompileWatch()) for m in methods}  # (warm-up, timed)
    results: dict[str, RunResult] = {}
    failed: dict[str, str] = {}
    total = (warmup + repeats) * len(methods) + sum(m.profile is not None for m in methods)
    with tqdm(total=total, desc="bench", disable=not progress) as bar:
        for round_ in range(warmup + repeats):
            for method in methods:  # interleaved, so drifts in machine load hit every method alike
                bar.update(1)
                if method.name in failed:
                    continue
                try:
                    with watches[method.name][round_ >= warmup]:
                        seconds, result = _timed(method.run, device)
                except Exception as error:  # noqa: BLE001 (reported in the row; the reference row must run)
                    if method is methods[0]:
                        raise
                    failed[method.name] = _describe_error(error)
                    logger.warning("%s failed; reported as a failed row", method.name, exc_info=True)
                    reset_graphs()  # so that the CUDA graphs of the rows after it still record and replay
                    continue
                if round_ >= warmup:
                    timings[method.name].append(seconds)
                results[method.name] = result
            if checkpoint is not None and round_ >= warmup:  # near-ties and the round split come at the end
                checkpoint(_table(methods, timings, results, failed, watches, {}, None), results)
        profiles = {}
        for method in methods:
            if method.profile is not None and method.name not in failed:
                try:
                    profiles[method.name] = method.profile().stats
                except Exception:  # noqa: BLE001 (the split is left empty; the timed figures stand)
                    logger.warning("%s: the profiled run failed; no round split", method.name, exc_info=True)
                    reset_graphs()
            bar.update(method.profile is not None)
    rows = _table(methods, timings, results, failed, watches, profiles, ties)
    for method, row in zip(methods, rows):
        timed = watches[method.name][1]
        if timed.events and not row.error:
            logger.warning("%s: %d compile events during timed runs (%.1f s); the warm-up did not cover its shapes",
                           method.name, timed.events, timed.seconds)
    return rows, results


def partial_reports(report_of: Callable[..., BenchReport], checkpoint: Callable[[BenchReport], None] | None,
                    repeats: int) -> Checkpoint | None:
    """A `run_benchmark` checkpoint that hands `checkpoint` the report so far, built by
    `report_of(rows, outputs, partial)` (None without `checkpoint`)."""
    if checkpoint is None:
        return None
    rounds = 0

    def call(rows: list[BenchRow], outputs: dict[str, RunResult]) -> None:
        nonlocal rounds
        rounds += 1
        checkpoint(report_of(rows, outputs, f"{rounds} of {repeats} timed rounds run (medians so far); the "
                                            "per-round split and near-tie counts come with the whole report"))
    return call


def _table(methods: list[Method], timings: dict[str, list[float]], results: dict[str, RunResult],
           failed: dict[str, str], watches: dict, profiles: dict, ties: TieJudge | None) -> list[BenchRow]:
    """The rows from the timed runs so far (each a median): failed methods as failed rows, the first as the
    reference for `speedup` and `outputs match`, every row against the fastest baseline."""
    base_rate = None
    rows = []
    for method in methods:
        if method.name in failed:
            rows.append(BenchRow(method=method.name, tokens_per_s=0.0, speedup=0.0, mean_accepted=None, matched=False,
                                 new_tokens=0, median_s=0.0, note=method.note, baseline=method.baseline,
                                 error=failed[method.name]))
            continue
        result, median = results[method.name], statistics.median(timings[method.name])
        new_tokens = sum(len(r) for r in result.rows)
        rate = new_tokens / median
        base_rate = base_rate or rate
        warm, timed = watches[method.name]
        compiled = method.compiled if result.compiled is None else result.compiled
        reference = results[methods[0].name].rows
        differing, tied = (0, 0) if ties is None or result.rows == reference else count_ties(reference, result.rows,
                                                                                            ties)
        rows.append(BenchRow(method=method.name, tokens_per_s=rate, speedup=rate / base_rate,
                             mean_accepted=result.mean_accepted, matched=result.rows == reference,
                             new_tokens=new_tokens, median_s=median, note=method.note, extra=result.extra,
                             baseline=method.baseline, compiled=compiled, compile_s=warm.seconds,
                             timed_compiles=timed.events, round_ms=round_ms(profiles.get(method.name)),
                             differing_rows=differing, near_tie_rows=tied))
    compare_with_best_ar(rows)
    return rows


def _describe_error(error: Exception) -> str:
    """The error's type and last message line; where it has no message (a bare assert), where it was raised."""
    text = str(error).strip().splitlines()
    if not text and error.__traceback__ is not None:
        frame = error.__traceback__
        while frame.tb_next is not None:
            frame = frame.tb_next
        text = [f"raised at {frame.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno}"]
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:300]


__all__ = ["BenchReport", "BenchRow", "Method", "RunResult", "compare_with_best_ar", "distinct_ngram_share",
           "output_repetition", "repetition_note", "round_ms", "run_benchmark"]
