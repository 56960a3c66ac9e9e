"""`specmm bench core`: target-only greedy vs HF assisted generation vs specmm chain, tree and prompt lookup."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

import specmm
from specmm.bench.harness import BenchReport, Method, RunResult, run_benchmark
from specmm.machine import machine_info
from specmm.drafters import ModelDrafter, PromptLookupDrafter


@dataclass
class CoreBenchSetup:
    max_new_tokens: int = 128
    k: int = 4
    tree: specmm.TreeSpec = specmm.TreeSpec.dynamic(depth=5, top_k=4, total_tokens=24)
    eos_token_id: int | None = None
    pad_token_id: int = 0
    repeats: int = 3
    warmup: int = 1


def new_token_rows(sequences: Tensor, prompt_width: int, eos: int | None, pad: int) -> list[list[int]]:
    """Each row's new tokens up to and including its first EOS (padding after it dropped)."""
    rows = []
    for row in sequences[:, prompt_width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return rows


def core_methods(target: nn.Module, draft: nn.Module | None, input_ids: Tensor, attention_mask: Tensor,
                 setup: CoreBenchSetup) -> list[Method]:
    width, eos, pad, new = input_ids.shape[1], setup.eos_token_id, setup.pad_token_id, setup.max_new_tokens

    def target_only() -> RunResult:
        out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new,
                              eos_token_id=eos, pad_token_id=pad)
        return RunResult(new_token_rows(out, width, eos, pad))

    def hf_assisted() -> RunResult:
        rows = []
        for ids, mask in zip(input_ids, attention_mask):  # HF assisted generation refuses batch > 1
            prompt = ids[mask.bool()][None]
            out = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=new,
                                  num_assistant_tokens=setup.k, num_assistant_tokens_schedule="constant",
                                  eos_token_id=eos, pad_token_id=pad)
            rows += new_token_rows(out, prompt.shape[1], eos, pad)
        return RunResult(rows)

    def speculative(drafter_factory, tree) -> callable:
        def run() -> RunResult:
            gen = specmm.SpeculativeGenerator(target, drafter_factory(), tree=tree)
            out = gen.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new, eos_token_id=eos,
                               pad_token_id=pad)
            return RunResult(new_token_rows(out.sequences, width, eos, pad), out.stats.mean_accepted)
        return run

    methods = [Method(f"target-only (HF generate, batch {input_ids.shape[0]})", target_only)]
    if draft is not None:
        methods += [
            Method(f"HF assisted, k={setup.k} (batch 1, row by row)", hf_assisted,
                   note="transformers refuses batch > 1 for assisted generation"),
            Method(f"specmm chain k={setup.k}", speculative(lambda: ModelDrafter(draft), specmm.TreeSpec.chain(setup.k))),
            Method(f"specmm tree {_describe(setup.tree)}", speculative(lambda: ModelDrafter(draft), setup.tree)),
        ]
    methods.append(Method(f"specmm prompt lookup k={setup.k}",
                          speculative(lambda: PromptLookupDrafter(ngram=3, k=setup.k), specmm.TreeSpec.chain(setup.k))))
    return methods


def _describe(spec: specmm.TreeSpec) -> str:
    if spec.kind == "dynamic":
        return f"dynamic(depth={spec.depth}, top_k={spec.top_k}, total={spec.total_tokens})"
    return f"{spec.kind}({spec.num_nodes} nodes)"


def bench_core(target: nn.Module, draft: nn.Module | None, input_ids: Tensor, attention_mask: Tensor,
               setup: CoreBenchSetup, *, command: str, models: dict, notes: list[str], progress: bool = True
               ) -> tuple[BenchReport, dict[str, RunResult]]:
    """Run the core methods side by side; returns the report and every method's outputs."""
    device = next(target.parameters()).device
    with torch.no_grad():
        rows, outputs = run_benchmark(core_methods(target, draft, input_ids, attention_mask, setup), device,
                             repeats=setup.repeats, warmup=setup.warmup, progress=progress)
    info = {"batch": input_ids.shape[0], "prompt tokens (max)": input_ids.shape[1],
            "max_new_tokens": setup.max_new_tokens, "eos_token_id": setup.eos_token_id,
            "timing": f"median of {setup.repeats} after {setup.warmup} warm-up, methods interleaved", **models}
    report = BenchReport(name="specmm bench core", command=command, rows=rows, setup=info, notes=notes,
                         machine=machine_info(device))
    return report, outputs
