"""`specmm bench cspd`: the zoo continuous-token AR target alone vs CSpD with the zoo draft, side by side.

Every method generates the same class labels with a fixed seed (repeats re-time identical work). Quality is
compared by distribution: FID and KID of each method's images against the target-only images, on the zoo
classifier's features, next to the AR-vs-AR noise floor (the target alone with a second seed). Outputs are not
expected to be identical (sampling); exactness in law is a test (tests/image_ar/continuous), not a benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from specmm.bench.harness import BenchReport, Method, RunResult, partial_reports, run_benchmark
from specmm.core.stats import GenerationStats
from specmm.image_ar.continuous import CSpDSampler, sample_ar
from specmm.image_ar.continuous.heads import compile_chain
from specmm.image_ar.continuous.latents import decode
from specmm.image_ar.continuous.metrics import fid, kid
from specmm.image_ar.images import to_pil
from specmm.jobs import atomic_save_image
from specmm.machine import machine_info
from specmm.zoo.class_images import CLASSES


@dataclass
class CSpDBenchSetup:
    images: int = 200
    batch_size: int = 50
    draft_tokens: tuple[int, ...] = (4,)
    rules: tuple[str, ...] = ("trajectory", "final-step")
    prefill_tokens: int = 0
    temperature: float = 1.0
    repeats: int = 1
    warmup: int = 0
    seed: int = 0
    compile_heads: bool = False  # torch.compile every denoising chain (all rows alike); compiled untimed first
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("images", "batch_size", "repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if self.images < 2:
            raise ValueError(f"images: FID/KID need at least 2 images per method, got {self.images}")
        if not self.draft_tokens or any(k < 1 for k in self.draft_tokens):
            raise ValueError(f"draft_tokens: expected integers >= 1, got {self.draft_tokens}")


def _generate(sample, labels: Tensor, batch_size: int, seed: int) -> tuple[Tensor, GenerationStats]:
    """Tokens [N, T, C] in batches, one generator for the whole run; stats summed over batches."""
    gen = torch.Generator(device=labels.device).manual_seed(seed)
    tokens, total = [], GenerationStats()
    for chunk in labels.split(batch_size):
        out = sample(chunk, gen)
        tokens.append(out.tokens)
        total.add(out.stats)
    return torch.cat(tokens), total


def cspd_samplers(models: dict, setup: CSpDBenchSetup) -> list[tuple[str, Callable, int, bool]]:
    """(row name, sample(labels, generator), seed, speculative) per method."""
    target, draft, temperature = models["target"], models["draft"], setup.temperature
    rows = [("target-only AR", lambda c, g: sample_ar(target, c, temperature=temperature, generator=g), setup.seed,
             False),
            ("target-only AR, 2nd seed (noise floor)",
             lambda c, g: sample_ar(target, c, temperature=temperature, generator=g), setup.seed + 1, False),
            ("draft-only AR (latency ratio)", lambda c, g: sample_ar(draft, c, temperature=temperature, generator=g),
             setup.seed + 3, False)]
    for rule in setup.rules:
        for k in setup.draft_tokens:
            sampler = CSpDSampler(target, draft, draft_tokens=k, prefill_tokens=setup.prefill_tokens, rule=rule)
            rows.append((f"CSpD {rule} k={k}", lambda c, g, s=sampler: s.sample(c, temperature=temperature,
                                                                              generator=g), setup.seed + 2, True))
    return rows


def compile_and_warm(models: dict, setup: CSpDBenchSetup, labels: Tensor, images: int = 4) -> None:
    """Compile both heads' chains, then run every method untimed on a few images so that compilation (and the
    recompile for a second row count, after which shapes are dynamic) happens before any timing."""
    compile_chain(models["target"].head)
    if models["draft"].head is not models["target"].head:
        compile_chain(models["draft"].head)
    gen = torch.Generator(device=labels.device).manual_seed(setup.seed)
    for _name, sample, _seed, _speculative in cspd_samplers(models, setup):
        for chunk in labels[:images].split(setup.batch_size):
            sample(chunk, gen)


def cspd_methods(models: dict, labels: Tensor, setup: CSpDBenchSetup, store: dict) -> list[Method]:
    tokens_per_image = models["target"].config.num_tokens

    def run(name: str, sample, seed: int, speculative: bool):
        def method() -> RunResult:
            tokens, stats = _generate(sample, labels, setup.batch_size, seed)
            store[name] = (tokens, stats)
            cont = stats.continuous
            extra = {"accept rate": f"{cont.acceptance_rate:.2f}", "fallbacks": cont.fallbacks} if speculative else {}
            return RunResult([[0] * tokens_per_image for _ in range(tokens.shape[0])],
                             stats.mean_accepted if speculative else None, extra)
        return method

    return [Method(name, run(name, sample, seed, speculative))
            for name, sample, seed, speculative in cspd_samplers(models, setup)]


def sample_grid(images: dict[str, Tensor], columns: int, path: Path, cell: int = 64) -> Path:
    """One row of `columns` images per method (uint8 [N, 3, H, W]) -> a PNG."""
    rows = list(images)
    grid = Image.new("RGB", (columns * cell, len(rows) * cell), "white")
    for r, name in enumerate(rows):
        for c, picture in enumerate(to_pil(images[name][:columns])):
            grid.paste(picture.resize((cell, cell), Image.NEAREST), (c * cell, r * cell))
    return atomic_save_image(grid, path)


@torch.no_grad()
def bench_cspd(models: dict, setup: CSpDBenchSetup, *, command: str, description: dict, grid_path: Path | None = None,
               progress: bool = True, checkpoint: Callable[[BenchReport], None] | None = None
               ) -> tuple[BenchReport, dict]:
    """Run target-only AR, its noise floor and every CSpD variant; returns the report and each method's images.
    `checkpoint(report)` gets the timings so far after every timed round (FID/KID come with the whole report)."""
    device = next(models["target"].parameters()).device
    labels = (torch.arange(setup.images) % len(CLASSES)).to(device)
    store: dict = {}
    info = {"images": setup.images, "batch size": setup.batch_size, "temperature": setup.temperature,
            "prefill tokens": setup.prefill_tokens, "classes": len(CLASSES),
            "denoising chains": "torch.compile (every row)" if setup.compile_heads else "eager",
            "timing": f"median of {setup.repeats} after {setup.warmup} warm-up, methods interleaved", **description}

    def report_of(rows, outputs, partial: str = "", notes: list[str] | None = None) -> BenchReport:
        return BenchReport(name="specmm bench cspd", command=command, rows=rows, setup=info, notes=notes or [],
                           machine=machine_info(device), partial=partial)

    if setup.compile_heads:
        compile_and_warm(models, setup, labels, images=max(4, setup.batch_size))
    rows, _ = run_benchmark(cspd_methods(models, labels, setup, store), device, repeats=setup.repeats,
                            warmup=setup.warmup, progress=progress,
                            checkpoint=partial_reports(report_of, checkpoint, setup.repeats))
    images = {name: decode(models["vae"], tokens) for name, (tokens, _) in store.items()}
    features = {name: models["classifier"].features(pictures) for name, pictures in images.items()}
    reference = features["target-only AR"]
    for row, name in zip(rows, store):
        row.matched = None  # sampling: compared by distribution below, not token by token
        accuracy = (models["classifier"].predict(images[name]) == labels.cpu()).float().mean()
        row.extra = {**row.extra, "class acc": f"{accuracy:.2f}"}
        if name != "target-only AR":
            row.extra.update({"FID vs AR": f"{fid(features[name], reference):.2f}",
                              "KID vs AR x1e3": f"{1e3 * kid(features[name], reference):.2f}"})
    floor = next(r for r in rows if "noise floor" in r.method).extra
    notes = [(f"Noise floor: FID {floor['FID vs AR']}, KID x1e3 {floor['KID vs AR x1e3']} between two target-only runs "
             f"with different seeds, {setup.images} images each; a CSpD row is inside the noise floor when its "
             "FID/KID vs AR are comparable to these."),
             "tokens/s counts latent tokens (each drawn by a full denoising chain); the VAE decode is not timed.",
             "outputs match: n/a, every method samples; lossless-ness is tested as equality in distribution.",
             ("draft-only AR: the draft alone, one token per forward; its speedup is the target/draft per-token "
              "latency ratio, the most any k-token round could gain with every draft accepted is about "
              "(k + 1) / (k / ratio + 1).")]
    report = report_of(rows, None, notes=notes)
    if grid_path is not None:
        sample_grid(images, len(CLASSES), grid_path)
        report.notes.append(f"sample grid (one row per method, one image per class): {grid_path.name}")
    return report, images
