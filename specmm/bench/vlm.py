"""`specmm bench vlm`: captioning held-out zoo scenes with the zoo captioner, side by side in one process:
target alone, HF assisted generation with the zoo's text draft LM, and every VisionDrafter method, at
temperature 0 and 1, batch 1 and batch B. Outputs must be identical to the target's at temperature 0; at
temperature 1 the runs sample, so identity is not expected (exactness in law is a test, not a benchmark).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import specmm
from specmm.bench.core import _describe, new_token_rows
from specmm.bench.harness import BenchReport, Method, RunResult, run_benchmark
from specmm.jobs import atomic_write_text
from specmm.machine import machine_info


@dataclass
class VLMBenchSetup:
    scenes: int = 8
    batch_sizes: tuple[int, ...] = (1, 8)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    max_new_tokens: int = 160
    tree: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6))
    assisted_k: int = 3
    repeats: int = 3
    warmup: int = 1
    seed: int = 0


def vlm_methods(models, drafters: dict, enc: dict, setup: VLMBenchSetup, temperature: float) -> list[Method]:
    """Methods over one batch of processor outputs `enc` (left padded)."""
    target, draft, tokenizer = models.target, models.draft, models.processor.tokenizer
    width, eos, pad, new = enc["input_ids"].shape[1], tokenizer.eos_token_id, tokenizer.pad_token_id, setup.max_new_tokens
    sampled = temperature > 0
    hf_sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sampled else dict(do_sample=False)
    sampling = specmm.SamplingConfig(temperature=temperature)
    batch = enc["input_ids"].shape[0]

    def target_only() -> RunResult:
        torch.manual_seed(setup.seed)
        out = target.generate(**enc, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad, **hf_sampling)
        return RunResult(new_token_rows(out, width, eos, pad))

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

    def speculative(method: str):
        drafter = drafters[method]

        def run() -> RunResult:
            generators = [torch.Generator(target.device).manual_seed(setup.seed + i) for i in range(batch)]
            gen = specmm.SpeculativeGenerator(target, drafter, tree=setup.tree)
            out = gen.generate(**enc, max_new_tokens=new, sampling=sampling, eos_token_id=eos, pad_token_id=pad,
                               generator=generators if sampled else None)
            return RunResult(new_token_rows(out.sequences, width, eos, pad), out.stats.mean_accepted,
                             extra={"visual tokens seen": f"{drafter.visual_tokens_seen}/{drafter.image_tokens}"})
        return run

    methods = [Method(f"target-only (HF generate, batch {batch})", target_only)]
    if draft is not None:
        methods.append(Method(f"HF assisted, draft LM k={setup.assisted_k} (row by row)", hf_assisted))
    methods += [Method(f"specmm {name}, {_describe(setup.tree)}", speculative(name)) for name in drafters]
    return methods


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
    return {k: v.to(models.target.device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "pixel_values")}


def bench_vlm(models, drafters: dict, setup: VLMBenchSetup, *, command: str, description: dict,
              progress: bool = True) -> tuple[list[BenchReport], dict[tuple[float, int], dict[str, RunResult]]]:
    """One report per (temperature, batch size), every batch size covering the same `setup.scenes` scenes;
    also each configuration's outputs per method."""
    seeds = heldout_seeds(description.get("scale", "cpu"))[: setup.scenes]
    reports, outputs = [], {}
    for temperature in setup.temperatures:
        for batch in setup.batch_sizes:
            chunks = [scene_batch(models, seeds[i: i + batch]) for i in range(0, len(seeds), batch)]
            methods = _chunked([vlm_methods(models, drafters, enc, setup, temperature) for enc in chunks])
            with torch.no_grad():
                rows, outputs[temperature, batch] = run_benchmark(methods, models.target.device, repeats=setup.repeats, warmup=setup.warmup,
                                        progress=progress)
            if temperature > 0:
                for row in rows[1:]:
                    row.matched = None  # sampled: identical outputs are not expected
            info = {"temperature": temperature, "batch": batch, "scenes": len(seeds),
                    "max_new_tokens": setup.max_new_tokens, "tree": _describe(setup.tree),
                    "timing": f"median of {setup.repeats} after {setup.warmup} warm-up, methods interleaved",
                    **description}
            reports.append(BenchReport(name=f"specmm bench vlm: T={temperature:g}, batch {batch}", command=command,
                                       rows=rows, setup=info, machine=machine_info(models.target.device),
                                       notes=_notes(temperature)))
    return reports, outputs


def _chunked(per_chunk: list[list[Method]]) -> list[Method]:
    """Methods that run every chunk of the scenes in turn (batch-1 runs cover all scenes too)."""
    merged = []
    for i, first in enumerate(per_chunk[0]):
        runs = [chunk[i].run for chunk in per_chunk]

        def run(runs=runs) -> RunResult:
            results = [r() for r in runs]
            rows = [row for r in results for row in r.rows]
            accepted = [r.mean_accepted for r in results if r.mean_accepted is not None]
            tokens = [sum(len(row) for row in r.rows) for r in results]
            mean = sum(a * t for a, t in zip(accepted, tokens)) / sum(tokens) if accepted else None
            return RunResult(rows, mean, extra=results[0].extra)
        merged.append(Method(first.name, run, first.note))
    return merged


def _notes(temperature: float) -> list[str]:
    notes = ["Captions of held-out zoo scenes; the drafters were trained on other scenes (zoo captioner-drafters).",
             "visual tokens seen: image slots the drafter ran / image tokens in the prompts."]
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
