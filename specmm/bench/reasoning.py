"""`specmm bench reasoning`: ChainArith held-out problems, every method on the same problems in one process.

Per batch size: target-only (the baseline), draft-only, SpecReason and Arbitrage over threshold sweeps,
random routing at each of their measured acceptance rates, and exact token-level speculative decoding
(the core engine with the same draft). Step-level methods run in both schedules of `StepSpeculator`:
lockstep (batches of `batch` prompts, each advancing one step at a time) and asynchronous (rows advance on
their own; with `refill`, a waiting prompt joins as each row finishes). Target-only and token-level SD run
asynchronously with refill too (StepSpeculator's target-only policy, with exact token-level speculation
inside each step for the latter). Accuracy comes from the exact answer checker; throughput and latency are
measured wall-clock (device-synchronised, after a warm-up batch of every method), never modelled.

Methods run interleaved round by round: a round is `round_batches` batches of problems, so refill has
prompts waiting. The report gives tokens/s, problems/s, the mean latency per problem (from joining the
batch to its last step; for the core engine's token-level row, its batch's wall time), accuracy with its
standard error, and where the time goes (each model's busy share, then policy, prefill and the rest).

Plain decoding as a user of the stock model runs it is a baseline too: HF `generate` in batches, and with
`compile=True` also over a static cache with its decode step compiled (`fast_path.hf_static_compile_kwargs`).

With `compile=True` the core token-level row also runs in the core's compiled mode. Compiled rows warm up on every
round (each prompt width compiles), their compile seconds are reported apart, and compile events during timed
rounds are counted. Step-level rows stay eager (StepSpeculator has no compiled path).
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
from specmm.bench.core import new_token_rows
from specmm.bench.fast_path import compiled_parts, hf_compile_scope, hf_compiled, hf_static_compile_kwargs
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
from specmm.reasoning.timing import PHASES
from specmm.zoo.chainarith_task import JUDGE, answer_of

SCHEDULE_LABELS = {"lockstep": "lockstep", "async": "async"}


@dataclass
class ReasoningBenchSetup:
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    problems: dict[int, int] = field(default_factory=lambda: {1: 64, 8: 64, 64: 128, 256: 512})  # per batch size
    specreason_thresholds: tuple[float, ...] = (3.0, 6.0, 8.0)  # expected judge score, 0-9
    arbitrage_thresholds: tuple[float, ...] = (0.2, 0.5, 0.8)  # P(target better)
    max_new_tokens: int = 96
    max_step_tokens: int = 12
    token_sd_k: int = 3
    temperature: float = 0.0
    compile: bool = False  # also run the core token-level row in the core's compiled mode
    schedules: tuple[str, ...] = ("lockstep", "async")  # step-level rows run in each
    refill: bool = True  # asynchronous rows refill finished rows from the waiting prompts
    round_batches: int = 4  # batches of problems per interleaved round (what a refilling row can draw on)


@dataclass
class MethodResult:
    name: str
    accuracy: float
    stderr: float
    wall_s: float  # total over the rounds
    batches: int  # rounds run
    acceptance: float  # kept share of checked draft steps (nan when nothing is checked)
    draft_token_share: float
    new_tokens: int
    target_forwards: int
    mean_accepted: float | None  # tokens per target forward per row (None without target forwards)
    completions: list[list[int]]
    compiled: bool = False  # the target ran compiled
    compile_s: float = 0.0  # seconds compiling in the warm-up
    timed_compiles: int = 0  # compile events during timed rounds (0 unless the warm-up missed a shape)
    latency_per_problem_s: float = math.nan  # mean seconds from a problem joining the batch to its last step
    time_share: dict = field(default_factory=dict)  # share of the wall time per phase (draft, target, ...)
    baseline: bool = False  # plain decoding (target-only)

    @property
    def latency_s(self) -> float:
        """Mean wall time per round."""
        return self.wall_s / self.batches

    @property
    def problems_per_s(self) -> float:
        return len(self.completions) / self.wall_s


@dataclass
class Tally:
    """One method's running totals over the rounds it has run so far (stats summed with `add`)."""

    completions: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    batches: int = 0
    stats: GenerationStats = field(default_factory=GenerationStats)  # `reasoning` extras for step-level methods
    compiled: bool = False  # set by a run whose target took the compiled path
    latency_s: list[float] = field(default_factory=list)  # per problem
    phase_s: dict = field(default_factory=dict)  # seconds per phase (step-level methods)

    def result(self, name: str, problems, tokenizer, baseline: bool = False) -> MethodResult:
        acc, se = _accuracy(self.completions, problems, tokenizer)
        stats, steps, nan = self.stats, self.stats.reasoning, math.nan
        acceptance = steps.step_acceptance if steps is not None else None
        share = {}
        if self.phase_s:
            share = {p: self.phase_s.get(p, 0.0) / self.wall_s for p in PHASES if p != "other"}
            share["other"] = max(0.0, 1.0 - sum(share.values()))
        return MethodResult(name, acc, se, self.wall_s, self.batches, nan if acceptance is None else acceptance,
                            steps.draft_tokens / max(stats.new_tokens, 1) if steps is not None else nan,
                            stats.new_tokens, stats.target_forwards,
                            stats.mean_accepted if stats.target_forwards else None, self.completions,
                            compiled=self.compiled, latency_per_problem_s=sum(self.latency_s) / len(self.latency_s),
                            time_share=share, baseline=baseline)


def _synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _accuracy(completions, problems, tokenizer) -> tuple[float, float]:
    hits = [answer_of(tokenizer.decode(c)) == p.answer for c, p in zip(completions, problems)]
    acc = sum(hits) / len(hits)
    return acc, math.sqrt(acc * (1 - acc) / len(hits))


def step_method(models, policy, setup: ReasoningBenchSetup, device, batch: int, schedule: str = "lockstep",
                inner: int | None = None):
    """A function running a round of problems through a step policy into a Tally (row b seeded start + b):
    lockstep in batches of `batch`, or asynchronously with `batch` rows in flight."""
    spec = StepSpeculator(models.target, models.draft, models.tokenizer, policy, delimiter=[models.step_token_id],
                          max_step_tokens=setup.max_step_tokens, inner_speculation=inner)
    sampling = specmm.SamplingConfig(temperature=setup.temperature)
    refill = setup.refill and schedule == "async"

    def run(problems, start: int, tally: Tally) -> None:
        begin = _synced(device)
        out = spec.generate([p.prompt for p in problems], max_new_tokens=setup.max_new_tokens, sampling=sampling,
                            seed=start, schedule=schedule, batch_size=batch, refill=refill)
        tally.wall_s += _synced(device) - begin
        tally.batches += 1
        tally.completions += out.completions
        tally.latency_s += out.latency_s
        for phase, seconds in out.phase_time_s.items():
            tally.phase_s[phase] = tally.phase_s.get(phase, 0.0) + seconds
        tally.stats.add(out.stats)
    return run


def hf_generate_method(models, setup: ReasoningBenchSetup, device, batch: int, static: bool = False):
    """Plain decoding with the stock model, in batches: HF `generate`, eager or (`static`) over a static cache with
    its decode step compiled. One token per target forward per row, by definition."""
    tokenizer, target = models.tokenizer, models.target
    sampling = {"do_sample": False} if setup.temperature == 0 else {  # top-k 0 and top-p 1 are off, passed so that
        "do_sample": True, "temperature": setup.temperature, "top_k": 0, "top_p": 1.0}  # no checkpoint default applies

    def run(problems, start: int, tally: Tally) -> None:
        torch.manual_seed(start)  # sampled rows: HF draws from the global generator
        for first in range(0, len(problems), batch):
            enc = tokenizer([p.prompt for p in problems[first: first + batch]], return_tensors="pt", padding=True)
            extra = hf_static_compile_kwargs(target) if static else {}
            begin = _synced(device)
            out = target.generate(enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                                  max_new_tokens=setup.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, **sampling, **extra)
            seconds = _synced(device) - begin
            tally.compiled = static and hf_compiled(target)
            rows = new_token_rows(out, enc["input_ids"].shape[1], tokenizer.eos_token_id, tokenizer.pad_token_id)
            tally.wall_s += seconds
            tally.latency_s += [seconds] * len(rows)  # no per-row finish time: the batch's
            tally.completions += rows
            counts = [len(row) for row in rows]
            tally.stats.add(GenerationStats(target_forwards=max(counts), new_tokens=sum(counts),
                                            new_tokens_per_row=counts, target_forwards_per_row=counts))
        tally.batches += 1
    return run


def token_sd_method(models, setup: ReasoningBenchSetup, device, batch: int, compile: bool = False):
    """Exact token-level speculation (core engine, chain of k draft tokens) on whole solutions, in batches."""
    tokenizer = models.tokenizer
    gen = specmm.SpeculativeGenerator(models.target, ModelDrafter(models.draft),
                                      tree=specmm.TreeSpec.chain(setup.token_sd_k), compile=compile)
    sampling = specmm.SamplingConfig(temperature=setup.temperature)

    def run(problems, start: int, tally: Tally) -> None:
        for first in range(0, len(problems), batch):
            part = problems[first: first + batch]
            enc = tokenizer([p.prompt for p in part], return_tensors="pt", padding=True)
            begin = _synced(device)
            out = gen.generate(enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                               max_new_tokens=setup.max_new_tokens, sampling=sampling,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            seconds = _synced(device) - begin
            tally.wall_s += seconds
            tally.latency_s += [seconds] * len(part)  # no per-row finish time: the batch's
            tally.compiled = "target" in compiled_parts(gen)
            tally.completions += new_token_rows(out.sequences, enc["input_ids"].shape[1], tokenizer.eos_token_id,
                                                tokenizer.pad_token_id)
            tally.stats.add(out.stats)
        tally.batches += 1
    return run


def run_interleaved(methods: dict[str, Callable], problems, batch: int, tokenizer, progress: bool, desc: str,
                    round_size: int, compiled: frozenset[str] = frozenset(),
                    baselines: frozenset[str] = frozenset()) -> list[MethodResult]:
    """Every method on every round of problems, methods interleaved within each round (so a slow spell of a
    shared machine hits all methods alike), after a warm-up batch per method; `compiled` methods warm up on
    every round, so the timed rounds meet only shapes they compiled."""
    starts = range(0, len(problems), round_size)
    watches = {name: (CompileWatch(), CompileWatch()) for name in methods}  # (warm-up, timed)
    for name, run in methods.items():
        with watches[name][0]:
            if name in compiled:
                for start in starts:
                    run(problems[start: start + round_size], start, Tally())
            else:
                run(problems[:batch], 0, Tally())
    tallies = {name: Tally() for name in methods}
    for start in tqdm(starts, desc=desc, disable=not progress):
        for name, run in methods.items():
            with watches[name][1]:
                run(problems[start: start + round_size], start, tallies[name])
    results = []
    for name in methods:
        result = tallies[name].result(name, problems, tokenizer, baseline=name in baselines)
        result.compile_s, result.timed_compiles = watches[name][0].seconds, watches[name][1].events
        results.append(result)
    return results


def _label(setup: ReasoningBenchSetup, schedule: str) -> str:
    return "async, refill" if schedule == "async" and setup.refill else SCHEDULE_LABELS[schedule]


def bench_batch_size(models, batch: int, setup: ReasoningBenchSetup, device, progress: bool) -> list[MethodResult]:
    problems = models.heldout_problems(setup.problems.get(batch, 2 * batch))
    template = JudgeTemplate.from_text(models.tokenizer, JUDGE)
    k, schedules = setup.token_sd_k, setup.schedules
    methods, baselines = {}, set()
    for schedule in ("lockstep", "async"):  # target-only always in both: the bars to beat
        name = f"target-only [{_label(setup, schedule)}]"
        methods[name] = step_method(models, TargetOnly(), setup, device, batch, schedule)
        baselines.add(name)
    hf_rows = {f"target-only (HF generate, batch {batch})": False}
    if setup.compile:
        hf_rows[f"target-only (HF generate, static cache + torch.compile, batch {batch})"] = True
    for name, static in hf_rows.items():
        methods[name] = hf_generate_method(models, setup, device, batch, static)
        baselines.add(name)
    methods["draft-only [lockstep]"] = step_method(models, DraftOnly(), setup, device, batch)
    policies = [SpecReason(t, template=template, method="expected") for t in setup.specreason_thresholds]
    policies += [Arbitrage(models.router, t) for t in setup.arbitrage_thresholds]
    for policy in policies:
        for schedule in schedules:
            methods[f"{policy.name} [{_label(setup, schedule)}]"] = step_method(models, policy, setup, device, batch,
                                                                               schedule)
    token_sd = f"token-level SD (exact, chain {k})"
    methods[f"{token_sd} [core, batched]"] = token_sd_method(models, setup, device, batch)
    compiled_sd = {f"{token_sd} [core, batched, compiled]"} if setup.compile else set()
    for name in compiled_sd:
        methods[name] = token_sd_method(models, setup, device, batch, compile=True)
    compiled = frozenset(compiled_sd | {name for name, static in hf_rows.items() if static})
    methods[f"{token_sd} [{_label(setup, 'async')}]"] = step_method(models, TargetOnly(), setup, device, batch,
                                                                   "async", inner=k)
    strictest = SpecReason(max(setup.specreason_thresholds), template=template, method="expected")
    for schedule in schedules:
        methods[f"{strictest.name} + token SD k={k} in regenerated steps [{_label(setup, schedule)}]"] = step_method(
            models, strictest, setup, device, batch, schedule, inner=k)
    round_size = batch * setup.round_batches
    with hf_compile_scope(models.target):  # the HF static row's compiled call lives on the model until the end
        results = run_interleaved(methods, problems, batch, models.tokenizer, progress, f"bench (batch {batch})",
                                  round_size, compiled, frozenset(baselines))
    # random routing at each measured acceptance rate of the learned policies, interleaved among themselves
    first = f"[{_label(setup, schedules[0])}]"
    matched = [r for r in results if r.name.startswith(("specreason", "arbitrage")) and "token SD" not in r.name
               and r.name.endswith(first) and not math.isnan(r.acceptance)]
    controls = {}
    for result in matched:
        policy = RandomRouting(round(1 - result.acceptance, 3), seed=batch)
        base = result.name[: -len(first) - 1]
        for schedule in schedules:
            controls[f"{policy.name} [matches {base}] [{_label(setup, schedule)}]"] = step_method(
                models, policy, setup, device, batch, schedule)
    results += run_interleaved(controls, problems, batch, models.tokenizer, progress, f"random (batch {batch})",
                               round_size)
    return results


def _time_split(share: dict) -> str:
    if not share:
        return "-"
    return " / ".join(f"{100 * share.get(p, 0.0):.0f}" for p in PHASES)


def report_for(results: list[MethodResult], batch: int, setup, command: str, description: dict,
               device) -> BenchReport:
    base = results[0]
    rows = []
    for r in results:
        within = abs(r.accuracy - base.accuracy) <= base.stderr
        rows.append(BenchRow(
            method=r.name, tokens_per_s=r.new_tokens / r.wall_s, speedup=base.wall_s / r.wall_s,
            mean_accepted=r.mean_accepted,
            matched=r.completions == base.completions, new_tokens=r.new_tokens, median_s=r.latency_s,
            baseline=r.baseline, compiled=r.compiled, compile_s=r.compile_s, timed_compiles=r.timed_compiles,
            extra={"problems/s": f"{r.problems_per_s:.2f}", "latency/problem s": f"{r.latency_per_problem_s:.3f}",
                   "accuracy": f"{r.accuracy:.3f} ± {r.stderr:.3f}", "within 1 SE of target": "yes" if within else "no",
                   "step acceptance": "-" if math.isnan(r.acceptance) else f"{r.acceptance:.2f}",
                   "draft token share": "-" if math.isnan(r.draft_token_share) else f"{r.draft_token_share:.2f}",
                   "time % draft / target / policy / prefill / other": _time_split(r.time_share)}))
    compare_with_best_ar(rows)
    problems = setup.problems.get(batch, 2 * batch)
    notes = [
        ("speedup = first row's wall time / the method's, on the same problems; 'speedup vs best AR' is over the "
         "fastest target-only row (lockstep batches, asynchronous with refill, or HF generate). "
         "Wall time is measured per round "
         f"of {setup.round_batches} batches (device-synchronised, after a warm-up batch of every method; methods "
         "interleaved round by round, random controls in a second interleaved pass); 'median s' holds the mean "
         "wall time per round."),
        ("lockstep: batches of the batch size, each advancing one step at a time; async: every row advances on its "
         "own (same rollouts row by row)" + ("; refill: a waiting problem joins as each row finishes." if setup.refill
                                             else ".")),
        ("'latency/problem' = mean seconds from a problem joining the batch to its last step (core token-level "
         "row: its batch's wall time)."),
        ("'time %': share of the wall time in each model's forwards and sampling (the busy share of draft and "
         "target; judge prefills count as target time, the draft part of token-level rounds as draft time), in "
         "the policy's decisions, in prompt prefills, and the rest (bookkeeping). Phases are device-synchronised."),
        ("'mean accepted' = new tokens per target forward per row (judge forwards and regenerations count as "
         "target forwards)."),
        "'outputs match' compares every completion with the first row's; step-level methods are lossy by design.",
        "accuracy: exact answer check on held-out ChainArith problems, ± binomial standard error.",
        "random(p=...) escalates each step with probability p = 1 - the matched policy's measured acceptance.",
    ]
    notes.append("target-only (HF generate): the stock model's own batched decoding, the plain decoding a user "
                 "would pick (with --compile also over a static cache with its decode step compiled); latency/problem "
                 "is its batch's wall time.")
    if setup.compile:
        notes.append("The compiled rows (HF's static cache, the core token-level row) warmed up on every round (prompt "
                     "widths differ per batch); step-level rows, inner token SD included, run eager.")
    return BenchReport(name=f"specmm bench reasoning: batch {batch} ({problems} problems)", command=command,
                       rows=rows, setup={**description, "batch": batch, "problems": problems,
                                         "temperature": setup.temperature, "max_new_tokens": setup.max_new_tokens,
                                         "max_step_tokens": setup.max_step_tokens,
                                         "schedules": ", ".join(setup.schedules), "refill": setup.refill,
                                         "round": f"{setup.round_batches} batches"},
                       notes=notes, machine=machine_info(device))


def bench_reasoning(models, setup: ReasoningBenchSetup, *, command: str, description: dict, device,
                    progress: bool = True, on_batch=None) -> tuple[list[BenchReport], dict[int, list[MethodResult]]]:
    """Every batch size's rows and report; `on_batch(reports, results)` after each batch size (the CLI writes the
    report so far, so a run stopped part-way keeps its finished batch sizes)."""
    results, reports = {}, []
    with torch.no_grad():
        for batch in setup.batch_sizes:
            results[batch] = bench_batch_size(models, batch, setup, device, progress)
            reports.append(report_for(results[batch], batch, setup, command, description, device))
            if on_batch is not None:
                on_batch(reports, results)
    return reports, results


def plot(results: dict[int, list[MethodResult]], path: str | Path) -> Path:
    """Accuracy vs wall time (relative to the first row) per batch size, one curve per method family and schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    families = {"target-only": "k", "draft-only": "tab:gray", "specreason": "tab:blue", "arbitrage": "tab:orange",
                "random": "tab:green", "token-level": "tab:red"}
    for ax, (batch, rows) in zip(axes[0], results.items()):
        base = rows[0].wall_s
        for family, color in families.items():
            for schedule, style in (("lockstep", "o-"), ("async", "s--")):
                points = sorted((r.wall_s / base, r.accuracy, r.stderr) for r in rows
                                if r.name.startswith(family) and "token SD k=" not in r.name
                                and (f"[{schedule}" in r.name or (schedule == "lockstep" and "[core" in r.name)))
                if points:
                    x, y, e = zip(*points)
                    ax.errorbar(x, y, yerr=e, fmt=style if len(x) > 1 else style[0], color=color,
                                label=f"{family} ({schedule})")
        for r in rows:
            if "token SD k=" in r.name:
                ax.errorbar([r.wall_s / base], [r.accuracy], yerr=[r.stderr], fmt="D", color="tab:purple",
                            label="specreason + token SD" + (" (async)" if "[async" in r.name else ""))
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("wall time / the first row's (measured)")
        ax.set_ylabel("answer accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_writer(path) as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return path


def write(reports: list[BenchReport], results, directory: str | Path, stem: str,
          pending: tuple[int, ...] = ()) -> tuple[Path, Path, Path]:
    """The reports as Markdown, JSON and a plot, each replaced atomically; `pending`: batch sizes still to run (the
    report says it is partial)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png = plot(results, directory / f"{stem}.png")
    md = "\n\n".join(r.markdown() for r in reports) + f"\n\n![accuracy vs latency]({png.name})\n"
    if pending:
        md = f"**Partial report:** batch sizes {', '.join(map(str, pending))} have not run yet.\n\n" + md
    atomic_write_text(directory / f"{stem}.md", md)
    data = {"pending_batch_sizes": list(pending), "reports": [asdict(r) for r in reports],
            "results": {b: [{k: v for k, v in asdict(r).items() if k != "completions"} for r in rs]
                        for b, rs in results.items()}}
    atomic_write_text(directory / f"{stem}.json", json.dumps(data, indent=2))
    return directory / f"{stem}.json", directory / f"{stem}.md", png
