"""`specmm bench dlm`: diffusion-LM decoders side by side on the zoo `dlm-code` model, held-out code prompts.

One report per cache mode, each with stepwise decoding under that mode as its baseline: SSD (chain and
tree) must match it token for token; the lossy baselines report how far they moved (token agreement with
stepwise, accuracy against the true held-out continuation, and the NLL of their output under the zoo
`code` AR model when that entry is built). Forwards are counted, wall-clock is measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specmm.bench.harness import BenchReport, BenchRow, Method, RunResult, partial_reports, run_benchmark
from specmm.core.stats import GenerationStats
from specmm.diffusion_lm import generate
from specmm.jobs import atomic_write_text
from specmm.machine import machine_info


@dataclass
class DLMBenchSetup:
    prompts: int = 16
    batch_size: int = 4
    gen_length: int = 64
    block_length: int = 16
    draft_size: int = 8
    tree_width: int = 3
    tokens_per_step: int = 2
    threshold: float = 0.9
    caches: tuple[str | None, ...] = (None, "prefix")
    repeats: int = 3
    warmup: int = 1


def _methods(setup: DLMBenchSetup, cache: str | None) -> list[tuple[str, dict]]:
    s = setup
    return [("stepwise", {"method": "stepwise"}),
            (f"ssd chain N={s.draft_size}", {"method": "ssd", "draft_size": s.draft_size}),
            (f"ssd tree N={s.draft_size} w={s.tree_width}", {"method": "ssd", "draft_size": s.draft_size,
                                                                "tree_width": s.tree_width}),
            (f"low_confidence k={s.tokens_per_step} (lossy)", {"method": "low_confidence",
                                                                  "tokens_per_step": s.tokens_per_step}),
            (f"threshold {s.threshold} (lossy)", {"method": "threshold", "threshold": s.threshold}),
            ("prophet (lossy)", {"method": "prophet"})]


@torch.no_grad()
def judge_nll(judge, prompt_ids: torch.Tensor, rows: list[list[int]]) -> float:
    """Mean NLL (nats/token) of the generated rows under an AR judge, conditioned on their prompts."""
    seq = torch.cat((prompt_ids, torch.tensor(rows, device=prompt_ids.device)), dim=1)
    logits = judge(input_ids=seq).logits[:, prompt_ids.shape[1] - 1: -1].float()
    return F.cross_entropy(logits.flatten(0, 1), seq[:, prompt_ids.shape[1]:].flatten()).item()


def bench_dlm(model, prompt_ids: torch.Tensor, continuation_ids: torch.Tensor, setup: DLMBenchSetup, *,
              command: str, description: dict, judge=None, progress: bool = True,
              checkpoint: Callable[[list[BenchReport]], None] | None = None) -> tuple[list[BenchReport], dict]:
    """Run every decoder per cache mode; returns the reports and every method's outputs per mode.
    `checkpoint(reports)` gets the reports so far after every timed round, the last one partial."""
    device = prompt_ids.device
    batches = prompt_ids.split(setup.batch_size)
    truth = continuation_ids[:, : setup.gen_length].cpu()
    reports, outputs = [], {}
    for cache in setup.caches:
        stats: dict[str, GenerationStats] = {}

        def runner(name: str, kwargs: dict, cache=cache, stats=stats):
            def run() -> RunResult:
                total, rows = GenerationStats(), []
                for ids in batches:
                    out = generate(model, ids, setup.gen_length, setup.block_length, cache=cache, **kwargs)
                    rows += out.sequences[:, ids.shape[1]:].tolist()
                    total.add(out.stats)
                stats[name] = total
                return RunResult(rows, total.mean_accepted)
            return run

        def report_of(rows: list[BenchRow], results: dict[str, RunResult], partial: str = "", cache=cache,
                      stats=stats) -> BenchReport:
            reference = torch.tensor(results["stepwise"].rows)
            for row in rows:
                if row.error is not None:
                    continue
                out, st = torch.tensor(results[row.method].rows), stats[row.method]
                forwards, baseline = st.target_forwards, stats["stepwise"].target_forwards
                row.extra = {"forwards": forwards, "forward reduction": f"{baseline / forwards:.2f}x",
                             "rows/forward": f"{st.diffusion.forward_rows / forwards:.1f}",
                             "agreement w/ stepwise": f"{(out == reference).float().mean().item():.3f}",
                             "held-out accuracy": f"{(out == truth).float().mean().item():.3f}"}
                if judge is not None and not partial:  # the judge's forwards only once, for the whole report
                    row.extra["code-LM NLL"] = f"{judge_nll(judge, prompt_ids, results[row.method].rows):.3f}"
            info = {"cache": cache or "none", "prompts": prompt_ids.shape[0], "prompt tokens": prompt_ids.shape[1],
                    "batch size": setup.batch_size, "gen_length": setup.gen_length,
                    "block_length": setup.block_length,
                    "timing": f"median of {setup.repeats} after {setup.warmup} warm-up, methods interleaved",
                    **description}
            return BenchReport(name=f"specmm bench dlm (cache: {cache or 'none'})", command=command, rows=rows,
                               setup=info, notes=NOTES, machine=machine_info(device), partial=partial)

        methods = [Method(name, runner(name, kwargs)) for name, kwargs in _methods(setup, cache)]
        save = None if checkpoint is None else (lambda report: checkpoint(reports + [report]))
        rows, results = run_benchmark(methods, device, repeats=setup.repeats, warmup=setup.warmup, progress=progress,
                                      checkpoint=partial_reports(report_of, save, setup.repeats))
        reports.append(report_of(rows, results))
        outputs[cache] = results
    return reports, outputs


NOTES = [
    ("Greedy decoding. `outputs match` compares with stepwise decoding under the same cache mode "
     "(one token per forward, highest-confidence masked position of the current block, lowest-position "
     "tie-break, float64 softmax): SSD must match; lossy baselines are not expected to."),
    ("`mean accepted` = tokens committed per forward per row; `forwards` = batched model calls over all "
     "prompts (SSD runs N (chain) or N*w (tree) candidate states per row in each call: rows/forward)."),
    ("`held-out accuracy` = share of generated tokens equal to the true held-out continuation; `code-LM NLL` "
     "= NLL of the output under the zoo `code` AR target (lower: more plausible code)."),
]


def write_reports(reports: list[BenchReport], directory: str | Path, stem: str) -> tuple[Path, Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / f"{stem}.md", "\n\n".join(r.markdown() for r in reports))
    atomic_write_text(directory / f"{stem}.json", json.dumps([asdict(r) for r in reports], indent=2))
    return directory / f"{stem}.json", directory / f"{stem}.md"


def bench_dlm_zoo(scale: str, setup: DLMBenchSetup, device: torch.device, dtype: torch.dtype, *, command: str,
                  out: str | Path, name: str | None = None, progress: bool = True
                  ) -> tuple[list[BenchReport], tuple[Path, Path]]:
    """`specmm bench dlm`: build/load zoo dlm-code (and the code AR judge when built), run, write the reports."""
    from specmm import zoo
    from specmm.zoo import code, dlm_code

    entry = dlm_code.load(zoo.build("dlm-code", scale, progress=progress), device=device, dtype=dtype)
    if setup.prompts > len(entry.prompt_ids):
        raise ValueError(f"prompts: the zoo entry holds {len(entry.prompt_ids)} held-out prompts, got {setup.prompts}")
    if setup.gen_length > len(entry.continuation_ids[0]):
        raise ValueError(f"gen_length: at most {len(entry.continuation_ids[0])} (the held-out continuation length)")
    prompt_ids = torch.tensor(entry.prompt_ids[: setup.prompts], device=device)
    continuation_ids = torch.tensor(entry.continuation_ids[: setup.prompts], device=device)
    record = zoo.record("dlm-code", scale)
    description = {"model": f"zoo dlm-code-{scale} ({record['model']['parameters'] / 1e6:.2f}M params, held-out "
                   f"diffusion loss {record['model']['heldout_diffusion_loss']:.3f} nats/token)",
                   "dtype": str(dtype).replace("torch.", "")}
    judge = None
    try:
        judge = code.load(zoo.path("code", scale), device=device).target
        description["judge"] = f"zoo code-{scale} target (AR LM, same tokenizer)"
    except FileNotFoundError:
        pass
    stem = name or f"dlm-code-{scale}-{device.type}"
    reports, _ = bench_dlm(entry.model, prompt_ids, continuation_ids, setup, command=command,
                           description=description, judge=judge, progress=progress,
                           checkpoint=lambda partial: write_reports(partial, out, stem))
    return reports, write_reports(reports, out, stem)
