"""`specmm bench reasoning`: ChainArith held-out problems, every method on the same problems in one process.

Per batch size: target-only (the baseline), draft-only, SpecReason and Arbitrage over threshold sweeps,
random routing at each of their measured acceptance rates, and exact token-level speculative decoding
(the core engine with the same draft). Accuracy comes from the exact answer checker; latency is measured
wall-clock per batch (device-synchronised, after a warm-up run of every method), never modelled.
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
from specmm.bench.harness import BenchReport, BenchRow
from specmm.drafters import ModelDrafter
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
from specmm.zoo.chainarith import heldout_problems
from specmm.zoo.chainarith_task import JUDGE, answer_of


@dataclass
class ReasoningBenchSetup:
    batch_sizes: tuple[int, ...] = (1, 8, 64)
    problems: dict[int, int] = field(default_factory=lambda: {1: 24, 8: 64, 64: 128})  # per batch size
    specreason_thresholds: tuple[float, ...] = (1.0, 4.5, 8.0)  # expected judge score, 0-9
    arbitrage_thresholds: tuple[float, ...] = (0.3, 0.5, 0.7)  # P(target better)
    max_new_tokens: int = 96
    max_step_tokens: int = 12
    token_sd_k: int = 3
    temperature: float = 0.0


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
    completions: list[list[int]]

    @property
    def latency_s(self) -> float:
        return self.wall_s / self.batches


def _synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _accuracy(completions, problems, tokenizer) -> tuple[float, float]:
    hits = [answer_of(tokenizer.decode(c)) == p.answer for c, p in zip(completions, problems)]
    acc = sum(hits) / len(hits)
    return acc, math.sqrt(acc * (1 - acc) / len(hits))


def run_step_method(models, policy, problems, batch: int, setup: ReasoningBenchSetup, device,
                    inner: int | None = None) -> MethodResult:
    spec = StepSpeculator(models.target, models.draft, models.tokenizer, policy, delimiter=[models.step_token_id],
                          max_step_tokens=setup.max_step_tokens, inner_speculation=inner)
    sampling = specmm.SamplingConfig(temperature=setup.temperature)
    completions, wall, checked, kept, draft_tokens, tokens, forwards = [], 0.0, 0, 0, 0, 0, 0
    for i in range(0, len(problems), batch):
        prompts = [p.prompt for p in problems[i: i + batch]]
        start = _synced(device)
        out = spec.generate(prompts, max_new_tokens=setup.max_new_tokens, sampling=sampling, seed=i)
        wall += _synced(device) - start
        completions += out.completions
        decisions = [d for row in out.decisions for d in row if d is not None]
        checked, kept = checked + len(decisions), kept + sum(decisions)
        mask = out.completion_mask.bool()
        draft_tokens += int((out.source[mask] == 0).sum())
        tokens += int(mask.sum())
        forwards += out.counters["target_forwards"]
    acc, se = _accuracy(completions, problems, models.tokenizer)
    name = policy.name + (f" + token SD k={inner} in regenerated steps" if inner else "")
    return MethodResult(name, acc, se, wall, math.ceil(len(problems) / batch),
                        kept / checked if checked else math.nan, draft_tokens / max(tokens, 1), tokens, forwards,
                        completions)


def run_token_sd(models, problems, batch: int, setup: ReasoningBenchSetup, device) -> MethodResult:
    """Exact token-level speculation (core engine, chain of k draft tokens) on whole solutions."""
    tokenizer = models.tokenizer
    gen = specmm.SpeculativeGenerator(models.target, ModelDrafter(models.draft),
                                      tree=specmm.TreeSpec.chain(setup.token_sd_k))
    sampling = specmm.SamplingConfig(temperature=setup.temperature)
    completions, wall, tokens, forwards = [], 0.0, 0, 0
    for i in range(0, len(problems), batch):
        enc = tokenizer([p.prompt for p in problems[i: i + batch]], return_tensors="pt", padding=True)
        start = _synced(device)
        out = gen.generate(enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                           max_new_tokens=setup.max_new_tokens, sampling=sampling,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        wall += _synced(device) - start
        for row in out.sequences[:, enc["input_ids"].shape[1]:].tolist():
            completions.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
        tokens += out.stats.new_tokens
        forwards += out.stats.target_forwards
    acc, se = _accuracy(completions, problems, tokenizer)
    return MethodResult(f"token-level SD (exact, chain {setup.token_sd_k})", acc, se, wall,
                        math.ceil(len(problems) / batch), math.nan, math.nan, tokens, forwards, completions)


def bench_batch_size(models, batch: int, setup: ReasoningBenchSetup, device, progress: bool) -> list[MethodResult]:
    problems = heldout_problems(setup.problems.get(batch, 2 * batch))
    template = JudgeTemplate.from_text(models.tokenizer, JUDGE)
    runs: list[tuple[str, Callable[[list], MethodResult]]] = []

    def step(policy_factory):
        return lambda ps: run_step_method(models, policy_factory(), ps, batch, setup, device)

    runs.append(("target", step(TargetOnly)))
    runs.append(("draft", step(DraftOnly)))
    for t in setup.specreason_thresholds:
        runs.append(("specreason", step(lambda t=t: SpecReason(t, template=template, method="expected"))))
    for t in setup.arbitrage_thresholds:
        runs.append(("arbitrage", step(lambda t=t: Arbitrage(models.router, t))))
    runs.append(("token-sd", lambda ps: run_token_sd(models, ps, batch, setup, device)))
    strictest = max(setup.specreason_thresholds)
    runs.append(("specreason+sd", lambda ps: run_step_method(
        models, SpecReason(strictest, template=template, method="expected"), ps, batch, setup, device,
        inner=setup.token_sd_k)))
    results = []
    warm = problems[: batch]
    for _, fn in tqdm(runs, desc=f"warm-up (batch {batch})", disable=not progress):
        fn(warm)
    for _, fn in tqdm(runs, desc=f"bench (batch {batch})", disable=not progress):
        results.append(fn(problems))
    # random routing at each measured acceptance rate of the learned policies
    for result in [r for r in results if r.name.startswith(("specreason", "arbitrage")) and "token SD" not in r.name]:
        if not math.isnan(result.acceptance):
            p = round(1 - result.acceptance, 3)
            random_result = run_step_method(models, RandomRouting(p, seed=batch), problems, batch, setup, device)
            random_result.name = f"{random_result.name} [matches {result.name}]"
            results.append(random_result)
    return results


def report_for(results: list[MethodResult], batch: int, setup, command: str, description: dict,
               device) -> BenchReport:
    base = results[0]
    rows = []
    for r in results:
        within = abs(r.accuracy - base.accuracy) <= base.stderr
        rows.append(BenchRow(
            method=r.name, tokens_per_s=r.new_tokens / r.wall_s, speedup=base.latency_s / r.latency_s,
            mean_accepted=r.new_tokens / max(r.target_forwards, 1) if r.target_forwards else None,
            matched=r.completions == base.completions, new_tokens=r.new_tokens, median_s=r.latency_s,
            extra={"accuracy": f"{r.accuracy:.3f} ± {r.stderr:.3f}", "within 1 SE of target": "yes" if within else "no",
                   "step acceptance": "-" if math.isnan(r.acceptance) else f"{r.acceptance:.2f}",
                   "draft token share": "-" if math.isnan(r.draft_token_share) else f"{r.draft_token_share:.2f}"}))
    problems = setup.problems.get(batch, 2 * batch)
    notes = [
        ("speedup = target-only latency / method latency (latency = measured wall-clock per batch, device-"
        "synchronised, after one warm-up run of every method); 'median s' holds that mean latency per batch."),
        "'mean accepted' here = new tokens per target forward (judge prefills and regenerations included).",
        "'outputs match' compares every completion with target-only's; step-level methods are lossy by design.",
        "accuracy: exact answer check on held-out ChainArith problems, ± binomial standard error.",
        "random(p=...) escalates each step with probability p = 1 - the matched policy's measured acceptance.",
    ]
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(reports: list[BenchReport], results, directory: str | Path, stem: str) -> tuple[Path, Path, Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png = plot(results, directory / f"{stem}.png")
    md = "\n\n".join(r.markdown() for r in reports) + f"\n\n![accuracy vs latency]({png.name})\n"
    (directory / f"{stem}.md").write_text(md)
    data = {"reports": [asdict(r) for r in reports],
            "results": {b: [{k: v for k, v in asdict(r).items() if k != "completions"} for r in rs]
                        for b, rs in results.items()}}
    (directory / f"{stem}.json").write_text(json.dumps(data, indent=2))
    return directory / f"{stem}.json", directory / f"{stem}.md", png
