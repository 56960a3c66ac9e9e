"""`specmm bench vlm`: captioning held-out zoo scenes with the zoo captioner, side by side in one process:
plain decoding (HF `generate` eager, and with `--compile` over a static cache with its decode step compiled), HF
assisted generation with the zoo's text draft LM, and every VisionDrafter method on a chain and a dynamic tree,
eager and/or compiled, at temperature 0 and 1, batch 1 and batch B. Outputs must be identical to the target's at
temperature 0; at temperature 1 the runs sample, so identity is not expected (exactness in law is a test, not a
benchmark).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import specmm
from specmm.bench.core import _describe, new_token_rows, speculative_method, timing_note
from specmm.bench.fast_path import MODES, eager_drafter, hf_compile_scope, hf_compiled, hf_static_compile_kwargs
from specmm.bench.harness import BenchReport, BenchRow, Method, RunResult, partial_reports, run_benchmark
from specmm.jobs import atomic_write_text
from specmm.core.stats import GenerationStats
from specmm.machine import machine_info

TREES = ("chain", "dynamic")


@dataclass
class VLMBenchSetup:
    scenes: int = 8
    batch_sizes: tuple[int, ...] = (1, 8)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    max_new_tokens: int = 160
    tree: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6))
    k: int = 3  # chain length of the chain rows
    trees: tuple[str, ...] = ("dynamic",)  # "chain" and/or "dynamic" (`tree`)
    modes: tuple[str, ...] = ("eager",)  # specmm modes: "eager" and/or "compiled"
    hf_static: bool | None = None  # HF static cache + compiled baseline (None: when "compiled" is in modes)
    assisted: bool = True  # the HF assisted generation row (when the zoo has a draft LM)
    assisted_k: int = 3
    profile: bool = True  # one extra untimed profiled run per specmm row, for the per-round time split
    repeats: int = 3
    warmup: int = 1
    seed: int = 0

    def __post_init__(self):
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes: expected some of {MODES}, got {self.modes!r}")
        if not self.trees or set(self.trees) - set(TREES):
            raise ValueError(f"trees: expected some of {TREES}, got {self.trees!r}")
        if self.hf_static is None:
            self.hf_static = "compiled" in self.modes

    def tree_specs(self) -> dict[str, specmm.TreeSpec]:
        specs = {"chain": specmm.TreeSpec.chain(self.k), "dynamic": self.tree}
        return {name: specs[name] for name in TREES if name in self.trees}


def vlm_methods(models, drafters: dict, enc: dict, setup: VLMBenchSetup, temperature: float) -> list[Method]:
    """Methods over one batch of processor outputs `enc` (left padded)."""
    target, draft, tokenizer = models.target, models.draft, models.processor.tokenizer
    width, eos, pad, new = (enc["input_ids"].shape[1], tokenizer.eos_token_id, tokenizer.pad_token_id,
                            setup.max_new_tokens)
    sampled = temperature > 0
    hf_sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sampled
                   else dict(do_sample=False))
    sampling = specmm.SamplingConfig(temperature=temperature)
    batch = enc["input_ids"].shape[0]

    def target_only(static: bool):
        def run() -> RunResult:
            torch.manual_seed(setup.seed)
            extra = hf_static_compile_kwargs(target) if static else {}
            out = target.generate(**enc, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad, **hf_sampling,
                                  **extra)
            # compiled only if HF took its auto-compile path (a static cache it can compile), which stores the call
            return RunResult(new_token_rows(out, width, eos, pad), compiled=static and hf_compiled(target))
        return run

    def hf_assisted() -> RunResult:
        torch.manual_seed(setup.seed)
        rows = []
        for i in range(batch):  # transformers refuses batch > 1 for assisted generation
            keep = enc["attention_mask"][i].bool()
            one = {"input_ids": enc["input_ids"][i][keep][None], "pixel_values": enc["pixel_values"][i: i + 1]}
            out = target.generate(**one, assistant_model=draft, max_new_tokens=new, eos_token_id=eos,
                                  pad_token_id=pad, num_assistant_tokens=setup.assisted_k,
                                  num_assistant_tokens_schedule="constant", **hf_sampling)
            rows += new_token_rows(out, one["input_ids"].shape[1], eos, pad)
        return RunResult(rows)

    def speculative(method: str, tree: specmm.TreeSpec, mode: str) -> Method:
        drafter = drafters[method]

        def make(compile: bool, profile: bool):
            return specmm.SpeculativeGenerator(target, drafter if compile else eager_drafter(drafter), tree=tree,
                                               compile=compile, profile=profile)

        def generate(gen):
            generators = [torch.Generator(target.device).manual_seed(setup.seed + i) for i in range(batch)]
            out = gen.generate(**enc, max_new_tokens=new, sampling=sampling, eos_token_id=eos, pad_token_id=pad,
                               generator=generators if sampled else None)
            return RunResult(new_token_rows(out.sequences, width, eos, pad),
                             extra={"visual tokens seen": f"{drafter.visual_tokens_seen}/{drafter.image_tokens}"}
                             ), out.stats
        return speculative_method(f"specmm {method}, {_describe(tree)}", make, generate, mode, setup.profile)

    methods = [Method(f"target-only (HF generate, batch {batch})", target_only(False), baseline=True)]
    if setup.hf_static:
        methods.append(Method(f"target-only (HF generate, static cache + torch.compile, batch {batch})",
                              target_only(True), baseline=True, compiled=True))
    for mode in setup.modes:
        for name in drafters:
            methods += [speculative(name, tree, mode) for tree in _trees_for(drafters[name], setup)]
    if draft is not None and setup.assisted:  # last: where it fails (transformers 5.17 on a VLM), nothing runs after
        methods.append(Method(f"HF assisted, draft LM k={setup.assisted_k} (row by row)", hf_assisted))
    return methods


def _trees_for(drafter, setup: VLMBenchSetup) -> list[specmm.TreeSpec]:
    """The setup's trees this drafter can draft (the flash head proposes a fixed number of levels)."""
    specs = []
    for spec in setup.tree_specs().values():
        try:
            drafter.check_spec(spec)
        except ValueError:
            continue
        specs.append(spec)
    return specs


def heldout_seeds(scale: str) -> list[int]:
    from specmm import zoo

    return json.loads((zoo.path("captioner", scale) / "heldout.json").read_text())["seeds"]


def scene_images(models, seeds: list[int]) -> list:
    from specmm.zoo import captioner

    return [captioner.scenes.render(captioner.scene_and_caption(s)[0], models.image_size, seed=s) for s in seeds]


def scene_batch(models, seeds: list[int]) -> dict:
    from specmm.zoo import captioner

    images = scene_images(models, seeds)
    models.processor.tokenizer.padding_side = "left"
    enc = models.processor(images=images, text=[captioner.PROMPT] * len(seeds), return_tensors="pt", padding=True)
    return {k: v.to(models.target.device) for k, v in enc.items()
            if k in ("input_ids", "attention_mask", "pixel_values")}


def bench_vlm(models, drafters: dict, setup: VLMBenchSetup, *, command: str, description: dict,
              progress: bool = True, checkpoint: Callable[[list[BenchReport]], None] | None = None
              ) -> tuple[list[BenchReport], dict[tuple[float, int], dict[str, RunResult]]]:
    """One report per (temperature, batch size), every batch size covering the same `setup.scenes` scenes;
    also each configuration's outputs per method. `checkpoint(reports)` gets the reports so far after every timed
    round, the last one partial (see `run_benchmark`)."""
    seeds = heldout_seeds(description.get("scale", "cpu"))[: setup.scenes]
    reports, outputs = [], {}
    with torch.no_grad(), hf_compile_scope(models.target):
        for temperature in setup.temperatures:
            for batch in setup.batch_sizes:
                chunks = [scene_batch(models, seeds[i: i + batch]) for i in range(0, len(seeds), batch)]
                methods = _chunked([vlm_methods(models, drafters, enc, setup, temperature) for enc in chunks])

                def report_of(rows: list[BenchRow], _outputs=None, partial: str = "", temperature=temperature,
                              batch=batch) -> BenchReport:
                    if temperature > 0:
                        for row in rows[1:]:
                            row.matched = None  # sampled: identical outputs are not expected
                    info = {"temperature": temperature, "batch": min(batch, len(seeds)), "scenes": len(seeds),
                            "max_new_tokens": setup.max_new_tokens,
                            "trees": ", ".join(_describe(t) for t in setup.tree_specs().values()),
                            "specmm modes": ", ".join(setup.modes), "timing": timing_note(setup), **description}
                    return BenchReport(name=f"specmm bench vlm: T={temperature:g}, batch {min(batch, len(seeds))}",
                                       command=command,
                                       rows=rows, setup=info, machine=machine_info(models.target.device),
                                       notes=_notes(temperature, setup), partial=partial)

                save = None if checkpoint is None else (lambda report: checkpoint(reports + [report]))
                rows, outputs[temperature, batch] = run_benchmark(
                    methods, models.target.device, repeats=setup.repeats, warmup=setup.warmup, progress=progress,
                    checkpoint=partial_reports(report_of, save, setup.repeats))
                reports.append(report_of(rows))
    return reports, outputs


def _chunked(per_chunk: list[list[Method]]) -> list[Method]:
    """Methods that run every chunk of the scenes in turn (batch-1 runs cover all scenes too)."""
    merged = []
    for i, first in enumerate(per_chunk[0]):
        runs = [chunk[i].run for chunk in per_chunk]
        profiles = [chunk[i].profile for chunk in per_chunk] if first.profile is not None else None
        merged.append(Method(first.name, lambda runs=runs: _merge([r() for r in runs]), first.note,
                             baseline=first.baseline, compiled=first.compiled,
                             profile=(lambda p=profiles: _merge([r() for r in p])) if profiles else None))
    return merged


def _merge(results: list[RunResult]) -> RunResult:
    """One result for the chunks' results: rows in order, stats summed, compiled only if every chunk was."""
    rows = [row for r in results for row in r.rows]
    stats = None
    if all(r.stats is not None for r in results):
        stats = GenerationStats()
        for r in results:
            stats.add(r.stats)
    mean = stats.mean_accepted if stats is not None else None
    flags = [r.compiled for r in results]
    compiled = None if any(f is None for f in flags) else all(flags)
    return RunResult(rows, mean, extra=results[0].extra, stats=stats, compiled=compiled)


def _notes(temperature: float, setup: VLMBenchSetup) -> list[str]:
    notes = ["Captions of held-out zoo scenes; the drafters were trained on other scenes (zoo captioner-drafters).",
             "visual tokens seen: image slots the drafter ran / image tokens in the prompts (first batch)."]
    if setup.hf_static and setup.assisted:
        notes.append("HF assisted generation has no compiled row: transformers refuses static caches (and batches) "
                     "for it.")
    if temperature > 0:
        notes.append("T=1 samples: outputs are not expected to match (n/a); losslessness in law is tested by "
                     "chi-square tests in tests/vlm.")
    return notes


def write_reports(reports: list[BenchReport], directory: str | Path, stem: str) -> tuple[Path, Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    md = "\n\n".join(r.markdown() for r in reports)
    atomic_write_text(directory / f"{stem}.md", md)
    atomic_write_text(directory / f"{stem}.json", json.dumps([asdict(r) for r in reports], indent=2))
    return directory / f"{stem}.json", directory / f"{stem}.md"
