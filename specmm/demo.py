"""`make demo` / `specmm demo`: the main jobs on the built-in reference models, side by side with the target.

1. Captioning (the headline): held-out procedural scenes captioned by the zoo LLaVA captioner alone and with
   specmm's VisionDrafters (ViSpec, EAGLE), batch 8, greedy.
2. Code completion: held-out Python snippets with the zoo `code` pair through the core.
Missing zoo entries are trained on first use (cached). Prints the tables and writes `demo_report.html`
(inputs, outputs, tables).
"""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path

import torch

from specmm import zoo
from specmm.bench.core import CoreBenchSetup, bench_core
from specmm.bench.harness import BenchReport, RunResult
from specmm.bench.inputs import from_zoo
from specmm.core.tree import TreeSpec


def run_captioning(scale: str, device: str) -> tuple[BenchReport, str]:
    """The captioning section: (report, html)."""
    from specmm.bench.vlm import VLMBenchSetup, bench_vlm, heldout_seeds, scene_images
    from specmm.vlm import VisionDrafter
    from specmm.zoo import captioner

    print("specmm demo: captioning held-out scenes with the zoo LLaVA captioner (trained here on first use)")
    models = captioner.load(zoo.build("captioner", scale), device=torch.device(device))
    folder = zoo.build("captioner-drafters", scale)
    drafters = {m: VisionDrafter.from_pretrained(folder / m, models.target) for m in ("vispec", "eagle")}
    setup = VLMBenchSetup(scenes=8, batch_sizes=(8,), temperatures=(0.0,), repeats=2,
                          tree=TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6))
    reports, outputs = bench_vlm(models, drafters, setup, command=f"specmm demo --scale {scale}",
                                 description={"scale": scale, "target": f"zoo captioner-{scale}"})
    report = reports[0]
    print(report.table())
    runs = outputs[0.0, 8]
    names = list(runs)
    baseline, vispec = runs[names[0]], runs[names[2]]
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
    body = (f"<h2>Captioning</h2>{_table_html(report)}<p>Target alone vs {html.escape(names[2])}.</p>"
            f"<table><tr><th>scene</th><th>target alone</th><th>specmm</th><th></th></tr>{''.join(cells)}</table>")
    return report, body


def run_demo(scale: str = "cpu", batch: int = 4, max_new_tokens: int = 96, out: str | Path = "demo_report.html",
             device: str = "cpu") -> BenchReport:
    caption_report, caption_html = run_captioning(scale, device)
    try:
        zoo.path("code", scale)
    except FileNotFoundError:
        print(f"specmm demo: training the reference models (zoo entry 'code', scale {scale}) on this machine; "
              "this happens once and is cached under $SPECMM_HOME")
    data = from_zoo("code", scale, batch, torch.device(device), torch.float32)
    # short drafts: on CPU every draft forward costs ~0.2 target forwards (framework overhead), so long
    # chains and wide trees do not pay there; the GPU benchmarks use longer ones
    setup = CoreBenchSetup(max_new_tokens=max_new_tokens, k=2, tree=TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8),
                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id, repeats=3)
    print(f"specmm demo: {batch} held-out Python snippets, {max_new_tokens} new tokens each, greedy")
    report, outputs = bench_core(data.target, data.draft, data.input_ids, data.attention_mask, setup,
                                 command=f"specmm demo --scale {scale}", models=data.description, notes=[
                                     "Greedy decoding: every speculative method must reproduce the target's tokens.",
                                     "Tiny CPU models: per-forward overhead, not FLOPs, sets the cost; GPU reports "
                                     "are in benchmarks/."])
    print(report.table())
    path = Path(out)
    path.write_text(_html(report, data.prompts, outputs, data.tokenizer, caption_report, caption_html))
    print(f"wrote {path.resolve()}")
    return report


def _table_html(report: BenchReport) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(r.method)}</td><td>{r.tokens_per_s:.1f}</td><td>{r.speedup:.2f}x</td>"
        f"<td>{'-' if r.mean_accepted is None else f'{r.mean_accepted:.2f}'}</td>"
        f"<td>{'n/a' if r.matched is None else ('yes' if r.matched else 'NO')}</td></tr>" for r in report.rows)
    return (f"<table><tr><th>method</th><th>tokens/s</th><th>speedup</th><th>mean accepted</th>"
            f"<th>outputs identical</th></tr>{rows}</table>")


def _html(report: BenchReport, prompts: list[str], outputs: dict[str, RunResult], tokenizer,
          caption_report: BenchReport, caption_html: str) -> str:
    names = list(outputs)
    baseline, speculative = outputs[names[0]], outputs[names[min(2, len(names) - 1)]]
    cells = []
    for i, prompt in enumerate(prompts):
        cells.append(
            f"<tr><td><pre>{html.escape(prompt)}</pre></td>"
            f"<td><pre>{html.escape(tokenizer.decode(baseline.rows[i]))}</pre></td>"
            f"<td><pre>{html.escape(tokenizer.decode(speculative.rows[i]))}</pre></td>"
            f"<td>{'identical' if baseline.rows[i] == speculative.rows[i] else 'DIFFERENT'}</td></tr>")
    setup = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
                    for r in (caption_report, report) for k, v in r.setup.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for r in (caption_report, report) for n in r.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>specmm demo</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}} pre{{margin:0;white-space:pre-wrap;max-width:40em}}</style>
</head><body><h1>specmm demo</h1><p>{html.escape(time.strftime('%Y-%m-%d %H:%M'))} &middot; command
<code>{html.escape(report.command)}</code></p>
{caption_html}
<h2>Code completion</h2>{_table_html(report)}<p>Target alone vs {html.escape(names[min(2, len(names) - 1)])}.</p>
<table><tr><th>prompt</th><th>target alone</th><th>specmm</th><th></th></tr>{''.join(cells)}</table>
<h2>Setup</h2><ul>{setup}</ul><h2>Notes</h2><ul>{notes}</ul></body></html>
"""
