"""Benchmark reports: one row per method, written as JSON (every field) and Markdown (a table and notes).

Rows say what they are: `baseline` rows are plain decoding (HF `generate`, eager or static cache + compiled),
the bar a user would pick instead of speculation; `compiled` rows ran compiled (static shapes), with their
compile seconds measured in the warm-up and reported apart. `speedup_vs_best_ar` compares every row with the
fastest baseline, and `overhead_efficiency` divides it by the tokens each target forward commits: 1.0 means
a speculative round costs what one plain decoding step costs, and the lower it is, the more of the accepted
tokens the round's overheads eat.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specmm.jobs import atomic_write_text

PHASE_LABELS = {"draft": "draft", "verify": "verify", "accept_commit": "accept+commit", "other": "other"}


@dataclass
class BenchRow:
    method: str
    tokens_per_s: float
    speedup: float  # over the first row
    mean_accepted: float | None
    matched: bool | None  # every row's tokens equal the first row's (None: not expected, e.g. sampling)
    new_tokens: int
    median_s: float
    note: str = ""
    extra: dict = field(default_factory=dict)
    baseline: bool = False  # plain decoding: one token per target forward
    compiled: bool = False  # the target ran compiled (static shapes)
    compile_s: float = 0.0  # seconds compiling in the warm-up runs (never inside a timed figure)
    timed_compiles: int = 0  # compile events during the timed runs: 0 unless the warm-up missed a shape
    round_ms: dict[str, float] = field(default_factory=dict)  # ms per round and phase, from a profiled run
    speedup_vs_best_ar: float | None = None  # over the fastest baseline row
    overhead_efficiency: float | None = None  # speedup_vs_best_ar / mean accepted tokens per target forward
    error: str | None = None  # the method raised (figures are zeros): the exception, shown in the table
    differing_rows: int = 0  # output rows unlike the first method's (counted when the bench judges near-ties)
    near_tie_rows: int = 0  # of those, rows whose first difference is a near-tie of the target (`bench.ties`)

    @property
    def match_cell(self) -> str:
        """'yes', 'NO', 'n/a', or 'ties (n)' when every differing output row parts at a near-tie of the target."""
        if self.matched is None:
            return "n/a"
        if self.matched:
            return "yes"
        all_tied = self.differing_rows and self.near_tie_rows == self.differing_rows
        return f"ties ({self.near_tie_rows})" if all_tied else "NO"


def compare_with_best_ar(rows: list[BenchRow]) -> BenchRow | None:
    """Fill `speedup_vs_best_ar` and `overhead_efficiency` of every row against the fastest baseline row (the
    highest `speedup`, i.e. the shortest median time on the same tokens); returns that row (None: no baseline)."""
    baselines = [r for r in rows if r.baseline and r.error is None]
    if not baselines:
        return None
    best = max(baselines, key=lambda r: r.speedup)
    for row in rows:
        if row.error is not None:
            continue
        row.speedup_vs_best_ar = row.speedup / best.speedup
        accepted = 1.0 if row.baseline else row.mean_accepted
        row.overhead_efficiency = row.speedup_vs_best_ar / accepted if accepted else None
    return best


TINY_WARNING = ("TINY SCALE: a machinery check (models of a few thousand parameters, a few training steps, a few "
                "tokens). Every figure below is meaningless as a measure of speed or quality.")


def is_tiny(command: str, setup: dict) -> bool:
    """Whether a report ran on tiny-scale models: `--scale tiny` in its command, or a tiny zoo build in its setup."""
    if re.search(r"--scale[ =]tiny\b", command) or setup.get("scale") == "tiny":
        return True
    return any(isinstance(v, str) and re.search(r"-tiny\b|\(tiny\)", v) for v in setup.values())


@dataclass
class BenchReport:
    name: str
    command: str
    rows: list[BenchRow]
    setup: dict
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    partial: str = ""  # what has not run yet, for a report written while the benchmark runs ("" once it is whole)

    @property
    def tiny(self) -> bool:
        return is_tiny(self.command, self.setup)

    def table(self) -> str:
        """The rows as a markdown table, under the TINY SCALE banner when the models were tiny."""
        banner = f"**{TINY_WARNING}**\n\n" if self.tiny else ""
        return banner + self._rows_table()

    def _rows_table(self) -> str:
        rows = self.rows
        best_ar = any(r.speedup_vs_best_ar is not None for r in rows)
        compiled = any(r.compiled or r.compile_s > 0 for r in rows)
        split = any(r.round_ms for r in rows)
        extras = list(dict.fromkeys(k for r in rows for k in r.extra))
        columns = [("method", "---"), ("tokens/s", "---:"), ("speedup", "---:")]
        columns += [("speedup vs best AR", "---:")] if best_ar else []
        columns += [("mean accepted", "---:")] + ([("overhead eff.", "---:")] if best_ar else [])
        columns += [("outputs match", ":---:"), ("new tokens", "---:"), ("median s", "---:")]
        columns += [("compiled", ":---:"), ("compile s", "---:")] if compiled else []
        columns += [("ms/round draft / verify / accept+commit / other", "---:")] if split else []
        columns += [(k, "---:") for k in extras]
        lines = ["| " + " | ".join(c for c, _ in columns) + " |", "|" + "|".join(a for _, a in columns) + "|"]
        any_baseline = any(r.baseline for r in rows)
        for i, r in enumerate(rows):
            if r.error is not None:
                lines.append(f"| {r.method} | FAILED: {r.error.replace('|', '/')} |" + " - |" * (len(columns) - 2))
                continue
            plain = r.baseline or (i == 0 and not any_baseline)
            cells = [r.method, f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}x"]
            cells += [_ratio(r.speedup_vs_best_ar)] if best_ar else []
            cells += [f"{r.mean_accepted:.2f}" if r.mean_accepted is not None else ("1.00*" if plain else "n/a")]
            cells += [_number(r.overhead_efficiency)] if best_ar else []
            cells += [r.match_cell, str(r.new_tokens),
                      f"{r.median_s:.3f}"]
            if compiled:
                cells += ["yes" if r.compiled else "no", f"{r.compile_s:.1f}" if r.compiled or r.compile_s else "-"]
            if split:
                cells += [" / ".join(f"{r.round_ms[p]:.2f}" for p in PHASE_LABELS) if r.round_ms else "-"]
            cells += [str(r.extra.get(k, "-")) for k in extras]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def legend(self) -> str:
        rows = self.rows
        parts = ["`*` plain decoding: one token per target forward by definition. n/a: the method does not report it."]
        if any(r.speedup_vs_best_ar is not None for r in rows):
            best = "', '".join(r.method for r in rows if r.baseline and r.speedup_vs_best_ar == 1.0)
            parts.append(f"speedup: over the first row. speedup vs best AR: over the fastest plain-decoding row "
                         f"('{best}'). overhead eff. = speedup vs best AR / mean accepted (1.00: a round "
                         "costs one plain decoding step).")
        if any(r.compiled or r.compile_s > 0 for r in rows):
            parts.append("compile s: seconds `torch.compile` spent in the warm-up runs (dynamo and inductor, "
                         "CUDA-graph recordings); the timed runs reuse the compiled shapes, so no timed figure "
                         "includes it. specmm "
                         "shares a model's compiled forward between rows, so a row whose shapes an earlier row "
                         "compiled shows less.")
        if any(r.round_ms for r in rows):
            parts.append("ms/round: device-synchronised time per speculative round in each phase, from a separate "
                         "untimed run with profiling on (its syncs make it a little slower than the timed runs). "
                         "Compiled rows run each round as one graph, which has no phases to split: their profiled "
                         "run is eager over the same static caches, so its split describes that slower eager round.")
        if any(r.differing_rows for r in rows):
            parts.append("ties (n): outputs differ from the first row's, but each of the n differing rows first parts "
                         "at "
                         "a near-tie of the target (its two tokens' logits, from one forward over the common prefix in "
                         "the target's dtype, within the rounding of that precision; `specmm.bench.ties`): both are "
                         "the target's greedy text under a rounding of the low-precision sums. NO: some row parts "
                         "elsewhere.")
        failed = [r.method for r in rows if r.error is not None]
        if failed:
            parts.append(f"FAILED (the method raised; see the log): {', '.join(failed)}.")
        missed = [r.method for r in rows if r.timed_compiles]
        if missed:
            parts.append(f"WARNING: compiled during timed runs (the warm-up missed a shape, so these times include "
                         f"compilation): {', '.join(missed)}.")
        return "\n\n".join(parts)

    def markdown(self) -> str:
        setup = "\n".join(f"- {k}: {v}" for k, v in self.setup.items())
        machine = "\n".join(f"- {k}: {v}" for k, v in self.machine.items())
        notes = "\n".join(f"- {n}" for n in self.notes)
        partial = f"**Partial report:** {self.partial}\n\n" if self.partial else ""
        return (f"# {self.name}\n\n{partial}Command: `{self.command}`  \nRun: {self.created}\n\n{self.table()}\n\n"
                f"{self.legend()}\n\n"
                f"## Notes\n{notes}\n\n## Setup\n{setup}\n\n## Machine\n{machine}\n")

    def write(self, directory: str | Path, stem: str) -> tuple[Path, Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path, md_path = directory / f"{stem}.json", directory / f"{stem}.md"
        atomic_write_text(json_path, json.dumps(asdict(self), indent=2))
        atomic_write_text(md_path, self.markdown())
        return json_path, md_path


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


__all__ = ["BenchReport", "BenchRow", "PHASE_LABELS", "TINY_WARNING", "compare_with_best_ar", "is_tiny"]
