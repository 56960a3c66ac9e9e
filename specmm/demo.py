"""`make demo` / `specmm demo`: the main jobs on the built-in reference models, side by side with the target.

The headline section, captioning held-out procedural scenes with the zoo LLaVA captioner alone and with
specmm's ViSpec drafter (batch 8, greedy), always runs and trains what it needs on first use (cached).
Every other section (code completion through the core, one per modality) runs when its zoo entries are
built, or with `--all`, which builds them. Prints one table per section and writes `demo_report.html`
(inputs, outputs, tables).

The demo is a job like the others (`specmm.jobs`): it locks its report, rewrites it atomically after every
section (a kill or a crash never loses what already ran), and a section that fails becomes an error block in the
report while the other sections still run; `run_demo` then raises `DemoFailed` (the CLI: `specmm: error: ...`,
exit 2). Sizes come from what each zoo entry stores (the diffusion LM's continuation length, the models' context),
never from constants that fit only one scale.

specmm runs in compiled mode (static caches, compiled forwards) in the captioning and code sections, and the
target alone runs both as HF `generate` eager and with HF's static cache + `torch.compile`: speedups are read
against the faster of the two ("speedup vs best AR"). Compilation happens in the untimed warm-up and is printed
apart; inductor's on-disk cache (default /tmp/torchinductor_$USER) makes later runs compile much faster.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specmm import zoo
from specmm.bench.core import CoreBenchSetup, bench_core
from specmm.bench.harness import BenchReport, BenchRow
from specmm.bench.inputs import from_zoo
from specmm.bench.report import TINY_WARNING
from specmm.core.context import context_limit
from specmm.core.tree import TreeSpec
from specmm.jobs import OutputLock, atomic_write_text

logger = logging.getLogger(__name__)


class DemoFailed(ValueError):
    """Some sections failed (the report holds their error blocks); `reports` are those of the others."""

    def __init__(self, message: str, reports: list[BenchReport], failures: list[tuple[str, str]]):
        super().__init__(message)
        self.reports, self.failures = reports, failures


def new_token_budget(model, prompt_length: int, wanted: int, depth: int) -> int:
    """`wanted` new tokens, or fewer when the model's context cannot hold the prompt, the budget and a draft of
    `depth` tokens (at least 1)."""
    limit = context_limit(model)
    if limit is None:
        return wanted
    return max(1, min(wanted, limit - prompt_length - depth - 1))


@dataclass(frozen=True)
class DemoSection:
    title: str
    needs: tuple[str, ...]  # zoo entries the section loads
    run: Callable[[str, str], tuple[BenchReport, str]]  # (scale, device) -> (report, html body)
    cpu_build_minutes: int  # time to train `needs` once at --scale cpu on two idle cores (for the skip message)


def run_captioning(scale: str, device: str) -> tuple[BenchReport, str]:
    """Captioning: the zoo captioner alone vs ViSpec (and EAGLE when `captioner-drafters` is built)."""
    from specmm.bench.vlm import VLMBenchSetup, bench_vlm, heldout_seeds, scene_images
    from specmm.vlm import VisionDrafter
    from specmm.zoo import captioner

    print("specmm demo: captioning held-out scenes with the zoo LLaVA captioner (trained here on first use)")
    models = captioner.load(zoo.build("captioner", scale), device=torch.device(device))
    drafters = {"vispec": VisionDrafter.from_pretrained(zoo.build("captioner-vispec", scale) / "vispec",
                                                        models.target)}
    if zoo.is_built("captioner-drafters", scale):
        drafters["eagle"] = VisionDrafter.from_pretrained(zoo.path("captioner-drafters", scale) / "eagle",
                                                          models.target)
    micro = scale == "tiny"  # untrained micro models never stop by themselves: keep their runs short
    # compiled specmm against both plain-decoding baselines; HF assisted and eager specmm rows are in
    # `specmm bench vlm` (left out here to keep a cached demo within two minutes)
    setup = VLMBenchSetup(scenes=8, batch_sizes=(8,), temperatures=(0.0,), repeats=1 if micro else 2,
                          max_new_tokens=12 if micro else 160, tree=TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6),
                          trees=("dynamic",), modes=("compiled",), assisted=False, profile=False)
    reports, outputs = bench_vlm(models, drafters, setup, command=f"specmm demo --scale {scale}",
                                 description={"scale": scale, "target": f"zoo captioner-{scale}"})
    report = reports[0]
    runs = outputs[0.0, 8]
    names = list(runs)
    baseline, vispec = runs[names[0]], runs[next((n for n in names if "vispec" in n), names[-1])]
    tokenizer = models.processor.tokenizer
    cells = []
    for i, image in enumerate(scene_images(models, heldout_seeds(scale)[: setup.scenes])):
        buffer = io.BytesIO()
        image.resize((192, 192)).save(buffer, format="PNG")
        picture = base64.b64encode(buffer.getvalue()).decode()
        cells.append(f'<tr><td><img src="data:image/png;base64,{picture}"></td>'
                     f"<td>{html.escape(tokenizer.decode(baseline.rows[i], skip_special_tokens=True))}</td>"
                     f"<td>{html.escape(tokenizer.decode(vispec.rows[i], skip_special_tokens=True))}</td>"
                     f"<td>{'identical' if baseline.rows[i] == vispec.rows[i] else 'DIFFERENT'}</td></tr>")
    body = (f"{table_html(report)}<p>{html.escape(headline(report, 'vispec'))}</p><p>Target alone vs ViSpec.</p>"
            f"<table><tr><th>scene</th><th>target alone</th><th>specmm</th><th></th></tr>{''.join(cells)}</table>")
    return report, body


def run_code(scale: str, device: str, batch: int = 4, max_new_tokens: int = 96) -> tuple[BenchReport, str]:
    """Code completion: held-out Python snippets with the zoo `code` pair through the core."""
    data = from_zoo("code", scale, batch, torch.device(device), torch.float32)
    max_new_tokens = new_token_budget(data.target, data.input_ids.shape[1], max_new_tokens, depth=3)
    # short drafts: on CPU every draft forward costs ~0.2 target forwards (framework overhead), so long
    # chains and wide trees do not pay there; the GPU benchmarks use longer ones
    setup = CoreBenchSetup(max_new_tokens=max_new_tokens, k=2, tree=TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8),
                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id, repeats=3,
                           modes=("compiled",), profile=False)
    print(f"specmm demo: {batch} held-out Python snippets, {max_new_tokens} new tokens each, greedy")
    report, outputs = bench_core(data.target, data.draft, data.input_ids, data.attention_mask, setup,
                                 command=f"specmm demo --scale {scale}", models=data.description, notes=[
                                     "Greedy decoding: every speculative method must reproduce the target's tokens.",
                                     "Tiny CPU models: per-forward overhead, not FLOPs, sets the cost; GPU reports "
                                     "are in benchmarks/."])
    names = list(outputs)
    shown = next((n for n in names if n.startswith("specmm tree")), names[-1])  # (a failed row has no outputs)
    baseline, speculative = outputs[names[0]], outputs[shown]
    cells = [f"<tr><td><pre>{html.escape(prompt)}</pre></td>"
             f"<td><pre>{html.escape(data.tokenizer.decode(baseline.rows[i]))}</pre></td>"
             f"<td><pre>{html.escape(data.tokenizer.decode(speculative.rows[i]))}</pre></td>"
             f"<td>{'identical' if baseline.rows[i] == speculative.rows[i] else 'DIFFERENT'}</td></tr>"
             for i, prompt in enumerate(data.prompts)]
    body = (f"{table_html(report)}<p>{html.escape(headline(report, 'specmm tree'))}</p>"
            f"<p>Target alone vs {html.escape(shown)}.</p>"
            f"<table><tr><th>prompt</th><th>target alone</th><th>specmm</th><th></th></tr>{''.join(cells)}</table>")
    return report, body


def run_ssm(scale: str, device: str) -> tuple[BenchReport, str]:
    """Mamba2/attention hybrid (zoo ssm-code, Bamba) drafted by the code draft: AR vs chain SD vs STree."""
    import specmm
    from specmm.bench.ssm import DEVICE_DEFAULTS, SSMBenchSetup, bench_ssm
    from specmm.zoo import code, ssm_code

    print("specmm demo: the zoo Mamba2/attention hybrid (Bamba) on held-out Python snippets, greedy")
    torch_device = torch.device(device)
    shapes = DEVICE_DEFAULTS["cpu" if torch_device.type == "cpu" else "cuda"]
    record = zoo.record("ssm-code", scale)
    draft = code.load(zoo.path("code", record["recipe"]["code_scale"]), device=torch_device).draft
    target, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", scale), "hybrid", device=torch_device)
    batch = tokenizer(prompts[:4], return_tensors="pt", padding=True).to(torch_device)
    depth = max(shapes["k"], shapes["depth"], max(len(c) for c in shapes["static"]))
    budget = new_token_budget(target, batch["input_ids"].shape[1], 48, depth)
    setup = SSMBenchSetup(max_new_tokens=budget, k=(shapes["k"],), static=specmm.TreeSpec.static(shapes["static"]),
                          dynamic=specmm.TreeSpec.dynamic(depth=shapes["depth"], top_k=shapes["top_k"],
                                                          total_tokens=shapes["total_tokens"]),
                          pad_token_id=tokenizer.pad_token_id, repeats=1)
    report, _ = bench_ssm(target, draft, batch["input_ids"], batch["attention_mask"], setup,
                          name="SSM hybrid (STree)", command=f"specmm demo --scale {scale}",
                          models={"target": f"zoo ssm-code-{scale}/hybrid"}, notes=[], progress=False)
    return report, table_html(report)


def run_dlm(scale: str, device: str) -> tuple[BenchReport, str]:
    """Diffusion LM (zoo dlm-code): stepwise unmasking vs self-speculative decoding (SSD) and lossy baselines."""
    from specmm.bench.dlm import DLMBenchSetup, bench_dlm
    from specmm.zoo import dlm_code

    print("specmm demo: the zoo diffusion LM (LLaDA layout) completing held-out Python, stepwise vs SSD")
    entry = dlm_code.load(zoo.path("dlm-code", scale), device=torch.device(device), dtype=torch.float32)
    # the held-out continuations this build stores set the length (16 tokens at --scale tiny, 64 at cpu)
    gen_length = min(32, len(entry.continuation_ids[0]))
    block_length = 16 if gen_length % 16 == 0 else gen_length
    setup = DLMBenchSetup(prompts=4, batch_size=4, gen_length=gen_length, block_length=block_length, caches=(None,),
                          repeats=1, warmup=0)
    prompts = torch.tensor(entry.prompt_ids[:4], device=device)
    continuations = torch.tensor(entry.continuation_ids[:4], device=device)
    reports, _ = bench_dlm(entry.model, prompts, continuations, setup, command=f"specmm demo --scale {scale}",
                           description={"model": f"zoo dlm-code-{scale}"}, progress=False)
    return reports[0], "".join(table_html(r) for r in reports)


HEADLINE = DemoSection("Captioning", ("captioner", "captioner-vispec"), run_captioning, 16)
SECTIONS: list[DemoSection] = [
    DemoSection("Code completion", ("code",), run_code, 10),
    DemoSection("SSM hybrid (STree)", ("code", "ssm-code"), run_ssm, 7),
    DemoSection("Diffusion LM (SSD)", ("code", "dlm-code"), run_dlm, 5),
]


def demo_command(scale: str) -> str:
    """How to run this demo again at `scale` (the default scale needs no flag)."""
    return "specmm demo" if scale == "cpu" else f"specmm demo --scale {scale}"


def run_demo(scale: str = "cpu", out: str | Path = "demo_report.html", device: str = "cpu",
             build_all: bool = False) -> list[BenchReport]:
    """Run the headline and every section whose zoo entries are built (all of them with `build_all`); the report
    at `out` is rewritten after each section. Raises DemoFailed (after writing the report) if a section failed."""
    path = Path(out)
    results, skipped, failures = [], [], []
    if scale == "tiny":
        print(TINY_WARNING)
    with OutputLock(path.with_name(f".{path.name}.lock"), "--out", path):
        sections = [HEADLINE, *SECTIONS]
        for number, section in enumerate(sections):
            missing = [name for name in section.needs if not zoo.is_built(name, scale)]
            if missing and section is not HEADLINE and not build_all:
                skipped.append((section, missing))
                cost = ("seconds" if scale == "tiny" else f"about {section.cpu_build_minutes} min once on 2 CPU cores"
                        if scale == "cpu" else "once")
                print(f"specmm demo: skipping '{section.title}': zoo entries {', '.join(missing)} are not built at "
                      f"--scale {scale} ({cost}): run `{demo_command(scale)} --all` or "
                      + " && ".join(f"`specmm zoo build {name} --scale {scale}`" for name in missing))
            else:
                if missing:
                    print(f"specmm demo: training zoo entries {', '.join(missing)} (scale {scale}) for "
                          f"'{section.title}'; this happens once and is cached under $SPECMM_HOME")
                try:
                    for name in missing:  # --all: build what the section needs (a failed build fails the section)
                        zoo.build(name, scale)
                    report, body = section.run(scale, device)
                except Exception as err:  # noqa: BLE001 - a failing section must not take the report down
                    logger.debug("section %s failed", section.title, exc_info=True)
                    message = f"{type(err).__name__}: {err}"
                    print(f"specmm demo: section '{section.title}' failed: {message}")
                    failures.append((section.title, message))
                    results.append((section, None, error_block(err)))
                else:
                    print(f"\n## {section.title}\n{report.table()}")
                    compiling = compile_seconds(report)
                    if compiling:
                        print(f"compile time (untimed warm-up, in no figure above): {compiling:.1f} s")
                    summary = headline(report, "vispec" if section is HEADLINE else "specmm tree")
                    if summary:
                        print(summary)
                    results.append((section, report, body))
            atomic_write_text(path, _html(results, skipped, pending=[s.title for s in sections[number + 1:]],
                                           scale=scale))
    print(f"wrote {path.resolve()}")
    reports = [report for _, report, _ in results if report is not None]
    if failures:
        raise DemoFailed(f"demo: {len(failures)} section(s) failed ({'; '.join(f'{t}: {m}' for t, m in failures)}); "
                         f"the other sections ran and {path} has the details", reports, failures)
    return reports


def error_block(err: BaseException) -> str:
    """The report's block for a failed section: the error, and its traceback folded away."""
    trace = "".join(traceback.format_exception(err))
    return (f'<p class="error"><b>This section failed:</b> {html.escape(type(err).__name__)}: '
            f"{html.escape(str(err))}</p><details><summary>traceback</summary><pre>{html.escape(trace)}</pre></details>")


def compile_seconds(report: BenchReport) -> float:
    """Seconds the section's warm-up spent compiling (reported apart from every timed figure)."""
    return sum(r.compile_s for r in report.rows)


def best_ar(report: BenchReport) -> BenchRow | None:
    """The fastest plain-decoding row the report printed (HF generate eager or static + compiled)."""
    return max((r for r in report.rows if r.baseline), key=lambda r: r.speedup, default=None)


def headline(report: BenchReport, method: str) -> str:
    """One line: the first row whose name contains `method`, against the best target-only row."""
    best, row = best_ar(report), next((r for r in report.rows if method in r.method), None)
    if best is None or row is None or row.speedup_vs_best_ar is None:
        return ""
    same = "identical outputs" if row.matched else "outputs NOT identical"
    accepted = "" if row.mean_accepted is None else f", {row.mean_accepted:.2f} tokens per target forward"
    return f"{row.method}: {row.speedup_vs_best_ar:.2f}x the best target-only row ({best.method}){accepted}, {same}."


def table_html(report: BenchReport) -> str:
    best = any(r.speedup_vs_best_ar is not None for r in report.rows)
    head = ["method", "tokens/s", "speedup"] + (["speedup vs best AR"] if best else [])
    head += ["mean accepted", "outputs identical", "compiled", "compile s (warm-up, untimed)"]
    rows = []
    for r in report.rows:
        cells = [html.escape(r.method), f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}x"]
        cells += ["-" if r.speedup_vs_best_ar is None else f"{r.speedup_vs_best_ar:.2f}x"] if best else []
        cells += ["-" if r.mean_accepted is None else f"{r.mean_accepted:.2f}",
                  "n/a" if r.matched is None else ("yes" if r.matched else "NO"), "yes" if r.compiled else "no",
                  f"{r.compile_s:.1f}" if r.compile_s else "-"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def _html(results: list, skipped: list, pending: list[str] = (), scale: str = "cpu") -> str:
    sections = "".join(f"<h2>{html.escape(s.title)}</h2>"
                       + (f"<p>command <code>{html.escape(r.command)}</code></p>" if r is not None else "") + body
                       for s, r, body in results)
    skips = "".join(f"<li>{html.escape(s.title)}: needs <code>{html.escape(', '.join(m))}</code> "
                    f"(<code>{html.escape(demo_command(scale))} --all</code>)</li>" for s, m in skipped)
    waiting = "".join(f"<li>{html.escape(title)}</li>" for title in pending)
    setup = "".join(f"<li>{html.escape(s.title)}: " + html.escape(", ".join(f"{k}={v}" for k, v in r.setup.items()))
                    + "</li>" for s, r, _ in results if r is not None)
    notes = "".join(f"<li>{html.escape(n)}</li>" for _, r, _ in results if r is not None for n in r.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>specmm demo</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}} .error{{color:#a00}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}
pre{{margin:0;white-space:pre-wrap;max-width:40em}}</style>
</head><body><h1>specmm demo</h1><p>{html.escape(time.strftime('%Y-%m-%d %H:%M'))}</p>
{f'<p class="error"><b>{html.escape(TINY_WARNING)}</b></p>' if scale == "tiny" else ''}
{sections}{f'<h2>Still running</h2><ul>{waiting}</ul>' if waiting else ''}
{f'<h2>Skipped</h2><ul>{skips}</ul>' if skips else ''}
<h2>Setup</h2><ul>{setup}</ul><h2>Notes</h2><ul>{notes}</ul></body></html>
"""
