"""`specmm bench reasoning`: ChainArith held-out problems, every method on the same problems in one process.

Per batch size: target-only (the baseline), draft-only, SpecReason and Arbitrage over threshold sweeps,
random routing at each of their measured acceptance rates, and exact token-level speculative decoding
(the core engine with the same draft). Accuracy comes from the exact answer checker; latency is measured
wall-clock per batch (device-synchronised, after a warm-up run of every method), never modelled.

With `compile=True` the token-level row also runs in the core's compiled mode. Its warm-up covers every batch
(the batches' prompt widths differ, and each new shape compiles), its compile seconds are reported apart, and
compile events during timed batches are counted. Step-level rows stay eager (StepSpeculator has no compiled path).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

import specmm
from specmm.bench.compile_watch import CompileWatch
from specmm.bench.fast_path import compiled_parts
from specmm.bench.harness import BenchReport, BenchRow, compare_with_best_ar
from specmm.core.stats import GenerationStats
from specmm.drafters import ModelDrafter
from specmm.jobs import atomic_write_text, atomic_writer
from specmm.machine import machine_info
from specmm.reasoning import (
    Arbitrage,
    DraftOnly,
    JudgeTemplate,
    RandomRouting,
    SpecReason,
    StepSpeculator,
    TargetOnly,
)
from specmm.zoo.chainarith_task import JUDGE, answer_of


@dataclass
class ReasoningBenchSetup:
    batch_sizes: tuple[int, ...] = (1, 8, 64)
    problems: dict[int, int] = field(default_factory=lambda: {1: 64, 8: 64, 64: 128})  # per batch size
    specreason_thresholds: tuple[float, ...] = (3.0, 6.0, 8.0)  # expected judge score, 0-9
    arbitrage_thresholds: tuple[float, ...] = (0.2, 0.5, 0.8)  # P(target better)
    max_new_tokens: int = 96
    max_step_tokens: int = 12
    token_sd_k: int = 3
    temperature: float = 0.0
    compile: bool = False  # also run the token-level row in the core's compiled mode


@dataclass
class MethodResult:
    name: str
    accuracy: float
    stderr: float
    wall_s: float  # total over the batches
    batches: int
    acceptance: float  # kept share of checked draft steps (nan when nothing is checked)
    draft_token_share: float
    new_tokens: int
    target_forwards: int
    mean_accepted: float | None  # tokens per target forward per row (None without target forwards)
    completions: list[list[int]]
    compiled: bool = False  # the target ran compiled
    compile_s: float = 0.0  # seconds compiling in the warm-up
    timed_compiles: int = 0  # compile events during timed batches (0 unless the warm-up missed a shape)

    @property
    def latency_s(self) -> float:
        return self.wall_s / self.batches


@dataclass
class Tally:
    """One method's running totals over the batches it has run so far (stats summed with `add`)."""

    completions: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    batches: int = 0
    stats: GenerationStats = field(default_factory=GenerationStats)  # `reasoning` extras for step-level methods
    compiled: bool = False  # set by a run whose target took the compiled path

    def result(self, name: str, problems, tokenizer) -> MethodResult:
        acc, se = _accuracy(self.completions, problems, tokenizer)
        stats, steps, nan = self.stats, self.stats.reasoning, math.nan
        acceptance = steps.step_acceptance if steps is not None else None
        return MethodResult(name, acc, se, self.wall_s, self.batches, nan if acceptance is None else acceptance,
                            steps.draft_tokens / max(stats.new_tokens, 1) if steps is not None else nan,
                            stats.new_tokens, stats.target_forwards,
                            stats.mean_accepted if stats.target_forwards else None, self.completions,
                            compiled=self.compiled)


def _synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _accuracy(completions, problems, tokenizer) -> tuple[float, float]:
    hits = [answer_of(tokenizer.decode(c)) == p.answer for c, p in zip(completions, problems)]
    acc = sum(hits) / len(hits)
    return acc, math.sqrt(acc * (1 - acc) / len(hits))


def step_method(models, policy, setup: ReasoningBenchSetup, device, inner: int | None = None):
    """A function running one batch of problems through a step policy into a Tally (seeded by batch start)."""
    spec = StepSpeculator(models.target, models.draft, models.tokenizer, policy, delimiter=[models.step_token_id],
                          max_step_tokens=setup.max_step_tokens, inner_speculation=inner)
    sampling = specmm.SamplingConfig(temperature=setup.temperature)

    def run(problems, start: int, tally: Tally) -> None:
        begin = _synced(device)
        out = spec.generate([p.prompt for p in problems], max_new_tokens=setup.max_new_tokens, sampling=sampling,
                            seed=start)
        tally.wall_s += _synced(device) - begin
        tally.batches += 1
        tally.completions += out.completions
        tally.stats.add(out.stats)
    return run


def token_sd_method(models, setup: ReasoningBenchSetup, device, compile: bool = False):
    """Exact token-level speculation (core engine, chain of k draft tokens) on whole solutions."""
    tokenizer = models.tokenizer
    gen = specmm.SpeculativeGenerator(models.target, ModelDrafter(models.draft),
                                      tree=specmm.TreeSpec.chain(setup.token_sd_k), compile=compile)
    sampling = specmm.SamplingConfig(temperature=setup.temperature)

    def run(problems, start: int, tally: Tally) -> None:
        enc = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)
        begin = _synced(device)
        out = gen.generate(enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                           max_new_tokens=setup.max_new_tokens, sampling=sampling,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        tally.wall_s += _synced(device) - begin
        tally.batches += 1
        tally.compiled = "target" in compiled_parts(gen)
        for row in out.sequences[:, enc["input_ids"].shape[1]:].tolist():
            tally.completions.append(row[: row.index(tokenizer.eos_token_id) + 1]
                                     if tokenizer.eos_token_id in row else row)
        tally.stats.add(out.stats)
    return run


def run_interleaved(methods: dict[str, Callable], problems, batch: int, tokenizer, progress: bool,
                    desc: str, compiled: frozenset[str] = frozenset()) -> list[MethodResult]:
    """Every method on every batch of problems, methods interleaved within each batch (so a slow spell of a
    shared machine hits all methods alike), after one warm-up batch per method; `compiled` methods warm up on
    every batch, so the timed batches meet only shapes they compiled."""
    starts = range(0, len(problems), batch)
    watches = {name: (CompileWatch(), CompileWatch()) for name in methods}  # (warm-up, timed)
    for name, run in methods.items():
        with watches[name][0]:
            for start in (starts if name in compiled else starts[:1]):
                run(problems[start: start + batch], start, Tally())
    tallies = {name: Tally() for name in methods}
    for start in tqdm(starts, desc=desc, disable=not progress):
        for name, run in methods.items():
            with watches[name][1]:
                run(problems[start: start + batch], start, tallies[name])
    results = []
    for name in methods:
        result = tallies[name].result(name, problems, tokenizer)
        result.compile_s, result.timed_compiles = watches[name][0].seconds, watches[name][1].events
        results.append(result)
    return results


def bench_batch_size(models, batch: int, setup: ReasoningBenchSetup, device, progress: bool) -> list[MethodResult]:
    problems = models.heldout_problems(setup.problems.get(batch, 2 * batch))
    template = JudgeTemplate.from_text(models.tokenizer, JUDGE)
    policies = [TargetOnly(), DraftOnly()]
    policies += [SpecReason(t, template=template, method="expected") for t in setup.specreason_thresholds]
    policies += [Arbitrage(models.router, t) for t in setup.arbitrage_thresholds]
    methods = {policy.name: step_method(models, policy, setup, device) for policy in policies}
    token_sd = f"token-level SD (exact, chain {setup.token_sd_k})"
    methods[token_sd] = token_sd_method(models, setup, device)
    compiled = frozenset({f"{token_sd}, compiled"} if setup.compile else ())
    for name in compiled:
        methods[name] = token_sd_method(models, setup, device, compile=True)
    strictest = SpecReason(max(setup.specreason_thresholds), template=template, method="expected")
    methods[f"{strictest.name} + token SD k={setup.token_sd_k} in regenerated steps"] = step_method(
        models, strictest, setup, device, inner=setup.token_sd_k)
    results = run_interleaved(methods, problems, batch, models.tokenizer, progress, f"bench (batch {batch})",
                              compiled)
    # random routing at each measured acceptance rate of the learned policies, interleaved among themselves
    matched = [r for r in results if r.name.startswith(("specreason", "arbitrage")) and "token SD" not in r.name
               and not math.isnan(r.acceptance)]
    controls = {}
    for result in matched:
        policy = RandomRouting(round(1 - result.acceptance, 3), seed=batch)
        controls[f"{policy.name} [matches {result.name}]"] = step_method(models, policy, setup, device)
    results += run_interleaved(controls, problems, batch, models.tokenizer, progress, f"random (batch {batch})")
    return results


def report_for(results: list[MethodResult], batch: int, setup, command: str, description: dict,
               device) -> BenchReport:
    base = results[0]
    rows = []
    for r in results:
        within = abs(r.accuracy - base.accuracy) <= base.stderr
        rows.append(BenchRow(
            method=r.name, tokens_per_s=r.new_tokens / r.wall_s, speedup=base.latency_s / r.latency_s,
            mean_accepted=r.mean_accepted,
            matched=r.completions == base.completions, new_tokens=r.new_tokens, median_s=r.latency_s,
            baseline=r.name == "target-only", compiled=r.compiled, compile_s=r.compile_s,
            timed_compiles=r.timed_compiles,
            extra={"accuracy": f"{r.accuracy:.3f} ± {r.stderr:.3f}", "within 1 SE of target": "yes" if within else "no",
                   "step acceptance": "-" if math.isnan(r.acceptance) else f"{r.acceptance:.2f}",
                   "draft token share": "-" if math.isnan(r.draft_token_share) else f"{r.draft_token_share:.2f}"}))
    compare_with_best_ar(rows)
    problems = setup.problems.get(batch, 2 * batch)
    notes = [
        ("speedup = target-only latency / method latency (latency = measured wall-clock per batch, device-"
        "synchronised, after one warm-up batch of every method; methods interleaved batch by batch, random "
        "controls in a second interleaved pass); 'median s' holds that mean latency per batch."),
        ("'mean accepted' = new tokens per target forward per row (judge forwards and regenerations count as "
         "target forwards)."),
        "'outputs match' compares every completion with target-only's; step-level methods are lossy by design.",
        "accuracy: exact answer check on held-out ChainArith problems, ± binomial standard error.",
        "random(p=...) escalates each step with probability p = 1 - the matched policy's measured acceptance.",
    ]
    if setup.compile:
        notes.append("The compiled token-level row warmed up on every batch (prompt widths differ per batch); step-"
                     "level rows, inner token SD included, run eager.")
    return BenchReport(name=f"specmm bench reasoning: batch {batch} ({problems} problems)", command=command,
                       rows=rows, setup={**description, "batch": batch, "problems": problems,
                                         "temperature": setup.temperature, "max_new_tokens": setup.max_new_tokens,
                                         "max_step_tokens": setup.max_step_tokens},
                       notes=notes, machine=machine_info(device))


def bench_reasoning(models, setup: ReasoningBenchSetup, *, command: str, description: dict, device,
                    progress: bool = True) -> tuple[list[BenchReport], dict[int, list[MethodResult]]]:
    results, reports = {}, []
    with torch.no_grad():
        for batch in setup.batch_sizes:
            results[batch] = bench_batch_size(models, batch, setup, device, progress)
            reports.append(report_for(results[batch], batch, setup, command, description, device))
    return reports, results


def plot(results: dict[int, list[MethodResult]], path: str | Path) -> Path:
    """Accuracy vs latency (relative to target-only) per batch size, one curve per method family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    families = {"target-only": "k", "draft-only": "tab:gray", "specreason": "tab:blue", "arbitrage": "tab:orange",
                "random": "tab:green", "token-level": "tab:red"}
    for ax, (batch, rows) in zip(axes[0], results.items()):
        base = rows[0].latency_s
        for family, color in families.items():
            points = sorted((r.latency_s / base, r.accuracy, r.stderr) for r in rows
                            if r.name.startswith(family) and "token SD" not in r.name)
            if points:
                x, y, e = zip(*points)
                ax.errorbar(x, y, yerr=e, marker="o", color=color, label=family, linestyle="-" if len(x) > 1 else "")
        for r in rows:
            if "token SD" in r.name:
                ax.errorbar([r.latency_s / base], [r.accuracy], yerr=[r.stderr], marker="s", color="tab:purple",
                            label="specreason + token SD")
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("latency / target-only latency (measured)")
        ax.set_ylabel("answer accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_writer(path) as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return path


def write(reports: list[BenchReport], results, directory: str | Path, stem: str) -> tuple[Path, Path, Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png = plot(results, directory / f"{stem}.png")
    md = "\n\n".join(r.markdown() for r in reports) + f"\n\n![accuracy vs latency]({png.name})\n"
    atomic_write_text(directory / f"{stem}.md", md)
    data = {"reports": [asdict(r) for r in reports],
            "results": {b: [{k: v for k, v in asdict(r).items() if k != "completions"} for r in rs]
                        for b, rs in results.items()}}
    atomic_write_text(directory / f"{stem}.json", json.dumps(data, indent=2))
    return directory / f"{stem}.json", directory / f"{stem}.md", png
