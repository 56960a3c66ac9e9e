"""`specmm bench core`: plain decoding vs HF assisted generation vs specmm chain, tree and prompt lookup.

Every row runs in one process on the same inputs, interleaved. Baselines (plain decoding, `baseline=True`): HF
`generate` eager, and with `compile=True` also HF `generate` over a static cache with its decode step compiled
(the fastest plain decoding a stock HF user gets). specmm rows run in each of `setup.modes`: "eager" and/or
"compiled" (`SpeculativeGenerator(compile=True)`: static caches, compiled forwards; compile time reported apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

import specmm
from specmm.bench.fast_path import (FastPathSetup, compiled_parts, describe_parts, hf_compile_scope, hf_compiled,
                                    hf_static_compile_kwargs)
from specmm.bench.harness import (
    BenchReport,
    BenchRow,
    Method,
    RunResult,
    output_repetition,
    partial_reports,
    run_benchmark,
)
from specmm.bench.ties import logit_tie_judge
from specmm.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from specmm.machine import machine_info


@dataclass
class CoreBenchSetup(FastPathSetup):
    max_new_tokens: int = 128
    k: int = 4
    lookup_k: int | None = None  # prompt lookup's draft length (None: k); copying costs no forwards, so it can be long
    tree: specmm.TreeSpec = specmm.TreeSpec.dynamic(depth=5, top_k=4, total_tokens=24)
    trees: tuple[str, ...] = ("chain", "dynamic")  # rows per drafter: a chain of k tokens and/or `tree`
    lookup: bool = True  # the prompt lookup rows
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


def plain_decoding(target: nn.Module, input_ids: Tensor, attention_mask: Tensor, static: bool, max_new_tokens: int,
                   pad: int, cut_at: int | None, **generate_kwargs) -> RunResult:
    """A plain-decoding baseline row: HF greedy `generate` (`generate_kwargs` passed on), eager or (`static`) over a
    static cache with its decode step compiled; each row's new tokens up to its first `cut_at` (an EOS id)."""
    extra = hf_static_compile_kwargs(target) if static else {}
    out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens,
                          pad_token_id=pad, **generate_kwargs, **extra)
    # compiled only if HF took its auto-compile path (a static cache it can compile), which stores the call
    return RunResult(new_token_rows(out, input_ids.shape[1], cut_at, pad), compiled=static and hf_compiled(target))


def speculative_method(name: str, make_generator, generate, mode: str, profile: bool) -> Method:
    """A specmm row: `make_generator(compile, profile)` builds the generator, `generate(gen)` runs it and returns
    (RunResult without stats, GenerationStats); the row records which parts ran compiled."""
    compiled = mode == "compiled"

    def run(profiled: bool = False) -> RunResult:
        gen = make_generator(compiled, profiled)
        result, stats = generate(gen)
        result.stats, result.mean_accepted = stats, stats.mean_accepted
        if compiled:
            parts = compiled_parts(gen)
            result.compiled = "target" in parts
            rounds = {True: "one graph", False: "eager"}.get(gen.whole_round, "-")
            result.extra = {**result.extra, "compiled parts": describe_parts(parts), "rounds": rounds}
        return result

    def profiled() -> RunResult:
        return run(True)

    return Method(f"{name}, compiled" if compiled else name, run, compiled=compiled,
                  profile=profiled if profile else None)


def core_methods(target: nn.Module, draft: nn.Module | None, input_ids: Tensor, attention_mask: Tensor,
                 setup: CoreBenchSetup, drafters: dict[str, Callable[[], Drafter]] | None = None) -> list[Method]:
    """Baselines, HF assisted (with `draft`), then per mode: chain and tree rows drafted by `draft` ("specmm chain
    ...") and by each of `drafters` (label -> a new drafter per generation: "specmm <label> chain ..."), and
    prompt lookup."""
    width, eos, pad, new = input_ids.shape[1], setup.eos_token_id, setup.pad_token_id, setup.max_new_tokens
    batch = input_ids.shape[0]

    def target_only(static: bool):
        return lambda: plain_decoding(target, input_ids, attention_mask, static, new, pad, eos, eos_token_id=eos)

    def hf_assisted() -> RunResult:
        rows = []
        for ids, mask in zip(input_ids, attention_mask):  # HF assisted generation refuses batch > 1
            prompt = ids[mask.bool()][None]
            out = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=new,
                                  num_assistant_tokens=setup.k, num_assistant_tokens_schedule="constant",
                                  eos_token_id=eos, pad_token_id=pad)
            rows += new_token_rows(out, prompt.shape[1], eos, pad)
        return RunResult(rows)

    def speculative(name: str, drafter_factory, tree: specmm.TreeSpec, mode: str) -> Method:
        def make(compile: bool, profile: bool):
            return specmm.SpeculativeGenerator(target, drafter_factory(), tree=tree, compile=compile, profile=profile)

        def generate(gen):
            out = gen.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new, eos_token_id=eos,
                               pad_token_id=pad)
            return RunResult(new_token_rows(out.sequences, width, eos, pad)), out.stats
        return speculative_method(name, make, generate, mode, setup.profile)

    methods = [Method(f"target-only (HF generate, batch {batch})", target_only(False), baseline=True)]
    if setup.hf_static:
        methods.append(Method(f"target-only (HF generate, static cache + torch.compile, batch {batch})",
                              target_only(True), baseline=True, compiled=True,
                              note="HF's own compiled decoding: static cache, decode step compiled, prefill eager"))
    if draft is not None:
        methods.append(Method(f"HF assisted, k={setup.k} (batch 1, row by row)", hf_assisted,
                              note="transformers refuses batch > 1 and static caches for assisted generation"))
    factories = ({"": lambda: ModelDrafter(draft)} if draft is not None else {}) | dict(drafters or {})
    for mode in setup.modes:
        for label, factory in factories.items():
            prefix = f"specmm {label} " if label else "specmm "
            if "chain" in setup.trees:
                methods.append(speculative(f"{prefix}chain k={setup.k}", factory, specmm.TreeSpec.chain(setup.k), mode))
            if "dynamic" in setup.trees:
                methods.append(speculative(f"{prefix}tree {_describe(setup.tree)}", factory, setup.tree, mode))
        if setup.lookup:
            lookup_k = setup.lookup_k or setup.k
            methods.append(speculative(f"specmm prompt lookup k={lookup_k}",
                                       lambda: PromptLookupDrafter(ngram=3, k=lookup_k),
                                       specmm.TreeSpec.chain(lookup_k), mode))
    return methods


def _describe(spec: specmm.TreeSpec) -> str:
    if spec.kind == "dynamic":
        return f"dynamic(depth={spec.depth}, top_k={spec.top_k}, total={spec.total_tokens})"
    if spec.kind == "chain":
        return f"chain k={spec.depth}"
    return f"{spec.kind}({spec.num_nodes} nodes)"


def timing_note(setup) -> str:
    return (f"median of {setup.repeats} after {setup.warmup} warm-up, methods interleaved; compiled rows compile "
            "in the warm-up (same inputs and shapes as the timed runs)")


def bench_core(target: nn.Module, draft: nn.Module | None, input_ids: Tensor, attention_mask: Tensor,
               setup: CoreBenchSetup, *, command: str, models: dict, notes: list[str], progress: bool = True,
               drafters: dict[str, Callable[[], Drafter]] | None = None,
               checkpoint: Callable[[BenchReport], None] | None = None) -> tuple[BenchReport, dict[str, RunResult]]:
    """Run the core methods side by side (`drafters` as in `core_methods`); returns the report and every method's
    outputs. `checkpoint(report)` gets the partial report after every timed round (see `run_benchmark`)."""
    device = next(target.parameters()).device
    methods = core_methods(target, draft, input_ids, attention_mask, setup, drafters)

    def report_of(rows: list[BenchRow], outputs: dict[str, RunResult], partial: str = "") -> BenchReport:
        repetition, warnings = output_repetition(outputs)
        info = {"batch": input_ids.shape[0], "prompt tokens (max)": input_ids.shape[1],
                "max_new_tokens": setup.max_new_tokens, "eos_token_id": setup.eos_token_id,
                "specmm modes": ", ".join(setup.modes), "timing": timing_note(setup),
                **repetition, **models}
        return BenchReport(name="specmm bench core", command=command, rows=rows, setup=info, notes=notes + warnings,
                           machine=machine_info(device), partial=partial)

    with torch.no_grad(), hf_compile_scope(target):
        rows, outputs = run_benchmark(methods, device, repeats=setup.repeats, warmup=setup.warmup, progress=progress,
                                      ties=logit_tie_judge(target, input_ids, attention_mask),
                                      checkpoint=partial_reports(report_of, checkpoint, setup.repeats))
    report = report_of(rows, outputs)
    return report, outputs
