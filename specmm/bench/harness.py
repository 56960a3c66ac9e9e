"""Side-by-side benchmarks: one process, same inputs, warm-up, device sync, median of repeats.

A benchmark is a list of `Method`s; the first is the baseline. Each method returns the new tokens of
every row (so outputs can be compared with the baseline's) and, when it speculates, its stats.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specmm.jobs import atomic_write_text

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    rows: list[list[int]]  # new tokens of every row, padding stripped
    mean_accepted: float | None = None  # tokens per target forward (None for non-speculative methods)
    extra: dict = field(default_factory=dict)  # method-specific columns (e.g. visual tokens seen)


@dataclass
class Method:
    name: str
    run: Callable[[], RunResult]
    note: str = ""


@dataclass
class BenchRow:
    method: str
    tokens_per_s: float
    speedup: float  # over the baseline (first method)
    mean_accepted: float | None
    matched: bool | None  # every row's tokens equal the baseline's (None: not expected, e.g. sampling)
    new_tokens: int
    median_s: float
    note: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class BenchReport:
    name: str
    command: str
    rows: list[BenchRow]
    setup: dict
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))

    def table(self) -> str:
        extras = list(dict.fromkeys(k for r in self.rows for k in r.extra))
        head = "| method | tokens/s | speedup | mean accepted | outputs match | new tokens | median s |"
        lines = [head + "".join(f" {k} |" for k in extras), "|---|---:|---:|---:|:---:|---:|---:|" + "---:|" * len(extras)]
        for i, r in enumerate(self.rows):
            accepted = f"{r.mean_accepted:.2f}" if r.mean_accepted is not None else ("1.00*" if i == 0 else "n/a")
            matched = "n/a" if r.matched is None else ("yes" if r.matched else "NO")
            lines.append(f"| {r.method} | {r.tokens_per_s:.1f} | {r.speedup:.2f}x | {accepted} | {matched} | "
                         f"{r.new_tokens} | {r.median_s:.3f} |" + "".join(f" {r.extra.get(k, '-')} |" for k in extras))
        return "\n".join(lines)

    def markdown(self) -> str:
        setup = "\n".join(f"- {k}: {v}" for k, v in self.setup.items())
        machine = "\n".join(f"- {k}: {v}" for k, v in self.machine.items())
        notes = "\n".join(f"- {n}" for n in self.notes)
        return (f"# {self.name}\n\nCommand: `{self.command}`  \nRun: {self.created}\n\n{self.table()}\n\n"
                f"`*` plain decoding: one token per target forward by definition. n/a: the method does not "
                f"report it.\n\n"
                f"## Notes\n{notes}\n\n## Setup\n{setup}\n\n## Machine\n{machine}\n")

    def write(self, directory: str | Path, stem: str) -> tuple[Path, Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path, md_path = directory / f"{stem}.json", directory / f"{stem}.md"
        atomic_write_text(json_path, json.dumps(asdict(self), indent=2))
        atomic_write_text(md_path, self.markdown())
        return json_path, md_path


def _timed(fn: Callable[[], RunResult], device: torch.device) -> tuple[float, RunResult]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def run_benchmark(methods: list[Method], device: torch.device, *, repeats: int = 3, warmup: int = 1,
                  progress: bool = True) -> tuple[list[BenchRow], dict[str, RunResult]]:
    """Run every method `warmup + repeats` times (interleaved by round) and compare with the first.

    Returns the table rows and each method's last outputs.
    """
    timings: dict[str, list[float]] = {m.name: [] for m in methods}
    results: dict[str, RunResult] = {}
    total = (warmup + repeats) * len(methods)
    with tqdm(total=total, desc="bench", disable=not progress) as bar:
        for round_ in range(warmup + repeats):
            for method in methods:  # interleaved, so drifts in machine load hit every method alike
                seconds, result = _timed(method.run, device)
                if round_ >= warmup:
                    timings[method.name].append(seconds)
                results[method.name] = result
                bar.update(1)
    baseline = methods[0].name
    base_rate = None
    rows = []
    for method in methods:
        result, median = results[method.name], statistics.median(timings[method.name])
        new_tokens = sum(len(r) for r in result.rows)
        rate = new_tokens / median
        base_rate = base_rate or rate
        rows.append(BenchRow(method=method.name, tokens_per_s=rate, speedup=rate / base_rate,
                             mean_accepted=result.mean_accepted, matched=result.rows == results[baseline].rows,
                             new_tokens=new_tokens, median_s=median, note=method.note, extra=result.extra))
    return rows, results
