"""ImageSampler: class- or caption-conditional image sampling with a proposer and an acceptance rule.

The guided target prefills the condition and samples image token 0; the core `SpeculativeGenerator` runs the
rest (ragged rows, per-row generators). `proposer="ar"` is the plain one-token-per-forward baseline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from PIL import Image
from torch import Tensor

from specmm.core.acceptance import AcceptanceRule, AcceptResult, ExactRule
from specmm.core.engine import SpeculativeGenerator, _synchronize
from specmm.core.sampling import Generators, SamplingConfig, process_logits
from specmm.core.tree import TreeSpec
from specmm.image_ar.acceptance import GSD, SJD, Exact, Lantern
from specmm.image_ar.autoregressive import draw, generate_ar
from specmm.image_ar.drafter import ImageDrafter
from specmm.image_ar.jacobi import JacobiProposer
from specmm.image_ar.llamagen.model import LlamaGen
from specmm.image_ar.target import GuidedTarget

RULES = {"exact": Exact, "sjd": SJD}


@dataclass
class ImageSample:
    images: list[Image.Image]
    tokens: Tensor  # [B, N] image tokens (raster order)
    stats: dict = field(default_factory=dict)


class _RecordingGenerator(SpeculativeGenerator):
    """The core loop, plus a record of the target mass a relaxed rule moved onto each accepted draft."""

    moved: list[Tensor]  # per round, summed at the end (no host sync in the loop)

    def _accept(self, tree, logits: Tensor, sampling: SamplingConfig, generators: Generators) -> AcceptResult:
        result = super()._accept(tree, logits, sampling, generators)
        if hasattr(self.rule, "moved_mass") and not isinstance(self.rule, SJD):
            probs = logits.float().softmax(-1) if sampling.greedy else process_logits(logits, sampling)
            batch, depth = result.path.shape[0], result.path.shape[1] - 1
            nodes = result.path[:, 1:]  # [B, D]
            parents = result.path[:, :-1]
            tokens = tree.tokens.gather(1, nodes)
            parent_probs = probs.gather(1, parents[:, :, None].expand(-1, -1, probs.shape[-1]))  # [B, D, V]
            moved = self.rule.moved_mass(parent_probs.flatten(0, 1), tokens.flatten()).view(batch, depth)
            keep = torch.arange(depth, device=moved.device)[None, :] < result.num_accepted[:, None]
            self.moved.append((moved * keep).sum())
        return result


def _to_pil(images: Tensor) -> list[Image.Image]:
    pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(p) for p in pixels]


class ImageSampler:
    """Sample images from a LlamaGen with `proposer` ('ar' | 'jacobi' | an ImageDrafter) and `acceptance`
    ('exact' | 'sjd' | a rule object such as Lantern, LanternPP, GSD)."""

    def __init__(self, lg: LlamaGen, proposer: str | ImageDrafter = "jacobi",
                 acceptance: str | AcceptanceRule = "exact", tree: TreeSpec | None = None, window: int = 16,
                 init: str = "random", cfg_interval: int = -1):
        if not isinstance(lg, LlamaGen):
            raise ValueError(f"lg: expected a LlamaGen, got {type(lg).__name__}")  # noqa: TRY004 (project: ValueError)
        self.lg, self.target = lg, GuidedTarget(lg.gpt)
        if isinstance(acceptance, str):
            if acceptance not in RULES:
                raise ValueError(f"acceptance: expected {', '.join(RULES)} or a rule object, got {acceptance!r}")
            acceptance = RULES[acceptance]()
        if not isinstance(acceptance, AcceptanceRule):
            raise ValueError(f"acceptance: {type(acceptance).__name__} is not an acceptance rule")  # noqa: TRY004
        if isinstance(acceptance, (Lantern, GSD)):
            acceptance.bind(lg.vq.quantize.codebook().detach())
        self.rule: ExactRule = acceptance
        if isinstance(proposer, ImageDrafter):
            self.proposer = proposer.bind(self.target)
            self.tree = tree or TreeSpec.dynamic(depth=4, top_k=4, total_tokens=16)
        elif proposer == "jacobi":
            self.proposer = JacobiProposer(self.target, window, init)
            self.tree = TreeSpec.chain(window - 1)
        elif proposer == "ar":
            self.proposer, self.tree = None, None
        else:
            raise ValueError(f"proposer: expected 'ar', 'jacobi' or an ImageDrafter, got {proposer!r}")
        if isinstance(cfg_interval, bool) or not isinstance(cfg_interval, int) or cfg_interval < -1:
            raise ValueError(f"cfg_interval: expected -1 (always) or a token index >= 0, got {cfg_interval!r}")
        self.cfg_interval = cfg_interval

    def _check(self, conditions, cfg_scale: float) -> Tensor:
        if not isinstance(cfg_scale, (int, float)) or isinstance(cfg_scale, bool) or math.isnan(cfg_scale):
            raise ValueError(f"cfg_scale: expected a number >= 1, got {cfg_scale!r}")
        if cfg_scale < 1.0:
            raise ValueError(f"cfg_scale: guidance scale must be >= 1 (1 disables guidance), got {cfg_scale}")
        c = self.lg.config
        if cfg_scale > 1.0 and c.model_type == "c2i" and not c.has_null_class:
            raise ValueError("cfg_scale: guidance needs a null class, but the GPT was built with "
                             "class_dropout_prob=0 (no null-class embedding)")
        return self.lg.check_conditions(conditions)

    @torch.no_grad()
    def sample(self, conditions, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, generator: Generators = None, caption_mask: Tensor | None = None,
               decode: bool = True) -> ImageSample:
        """Sample one image per condition (class ids [B] or captions [B, T, D]); per-row generators allowed."""
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        conditions = self._check(conditions, cfg_scale)
        batch, n = conditions.shape[0], self.lg.config.block_size
        if generator is not None and not isinstance(generator, torch.Generator) and len(generator) != batch:
            raise ValueError(f"generator: expected one generator or {batch} (one per row), got {len(generator)}")
        device = self.target.device
        _synchronize(device)
        started = time.perf_counter()
        max_nodes = 1 if self.tree is None else self.tree.num_nodes
        first_logits = self.target.begin(conditions, cfg_scale, self.cfg_interval, max_nodes, caption_mask)
        moved: list[Tensor] = []
        if self.proposer is None or n == 1:
            tokens = generate_ar(self.target, first_logits, n, sampling, generator)
            forwards, histogram = [n] * batch, [n - 1] * (n > 1)
        else:
            first = draw(first_logits, sampling, generator)
            gen = _RecordingGenerator(self.target, self.proposer, tree=self.tree, acceptance=self.rule)
            gen.moved = moved
            out = gen.generate(first[:, None], max_new_tokens=n - 1, sampling=sampling, generator=generator)
            tokens = out.sequences[:, : n]
            forwards = [f + 1 for f in out.stats.target_forwards_per_row]  # + the condition prefill
            histogram = out.stats.accepted_histogram
        _synchronize(device)
        wall = time.perf_counter() - started
        images = _to_pil(self.lg.decode(tokens)) if decode else []
        drafts_accepted = sum(i * h for i, h in enumerate(histogram))
        stats = {"target_forwards_per_row": forwards, "tokens_per_row": n,
                     "step_compression": batch * n / max(sum(forwards), 1), "wall_time_s": wall,
                     "target_forwards": max(forwards), "accepted_histogram": list(histogram),
                     "moved_mass_total": float(sum(moved)) if moved else 0.0, "accepted_drafts": drafts_accepted,
                     "moved_mass_per_accepted_draft": float(sum(moved)) / drafts_accepted if moved and drafts_accepted else 0.0}
        return ImageSample(images=images, tokens=tokens, stats=stats)
