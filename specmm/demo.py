"""`make demo` / `specmm demo`: the main job on the built-in reference models, side by side with the target.

Builds the zoo's `code` entry when it is missing (first run only), generates from held-out prompts with the
target alone and with specmm, prints the table and writes `demo_report.html` (inputs, outputs, table).
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import torch

from specmm import zoo
from specmm.bench.core import CoreBenchSetup, bench_core
from specmm.bench.harness import BenchReport, RunResult
from specmm.bench.inputs import from_zoo
from specmm.core.tree import TreeSpec


def run_demo(scale: str = "cpu", batch: int = 4, max_new_tokens: int = 96, out: str | Path = "demo_report.html",
             device: str = "cpu") -> BenchReport:
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
    path.write_text(_html(report, data.prompts, outputs, data.tokenizer))
    print(f"wrote {path.resolve()}")
    return report


def _html(report: BenchReport, prompts: list[str], outputs: dict[str, RunResult], tokenizer) -> str:
    names = list(outputs)
    baseline, speculative = outputs[names[0]], outputs[names[min(2, len(names) - 1)]]
    cells = []
    for i, prompt in enumerate(prompts):
        cells.append(
            f"<tr><td><pre>{html.escape(prompt)}</pre></td>"
            f"<td><pre>{html.escape(tokenizer.decode(baseline.rows[i]))}</pre></td>"
            f"<td><pre>{html.escape(tokenizer.decode(speculative.rows[i]))}</pre></td>"
            f"<td>{'identical' if baseline.rows[i] == speculative.rows[i] else 'DIFFERENT'}</td></tr>")
    table_rows = "".join(
        f"<tr><td>{html.escape(r.method)}</td><td>{r.tokens_per_s:.1f}</td><td>{r.speedup:.2f}x</td>"
        f"<td>{'-' if r.mean_accepted is None else f'{r.mean_accepted:.2f}'}</td>"
        f"<td>{'yes' if r.matched else 'NO'}</td></tr>" for r in report.rows)
    setup = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>" for k, v in report.setup.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>specmm demo</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}} pre{{margin:0;white-space:pre-wrap;max-width:40em}}</style>
</head><body><h1>specmm demo</h1><p>{html.escape(time.strftime('%Y-%m-%d %H:%M'))} &middot; command
<code>{html.escape(report.command)}</code></p>
<h2>Speed</h2><table><tr><th>method</th><th>tokens/s</th><th>speedup</th><th>mean accepted</th>
<th>outputs identical</th></tr>{table_rows}</table>
<h2>Inputs and outputs</h2><p>Target alone vs {html.escape(names[min(2, len(names) - 1)])}.</p>
<table><tr><th>prompt</th><th>target alone</th><th>specmm</th><th></th></tr>{''.join(cells)}</table>
<h2>Setup</h2><ul>{setup}</ul><h2>Notes</h2><ul>{notes}</ul></body></html>
"""
