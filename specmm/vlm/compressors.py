"""Visual-token compressors: what a drafter sees of an image, as separate modules a method combines.

Each maps one image's input embeddings [N, H] (optionally with per-token importance scores) to the tokens
the drafter keeps, the image positions they take (indices into the image's span) and an optional global
vector that later text positions receive (ViSpec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class CompressedImage:
    tokens: Tensor  # [k, H] drafter inputs (they bypass the fc fusion)
    slots: Tensor  # [k] long: positions inside the image span the tokens take, increasing
    global_vector: Tensor | None = None  # [H] added to later positions through img_fc (ViSpec)
    fused: bool = False  # True: tokens are raw image embeddings to fuse with features like text (EAGLE)


class Identity(nn.Module):
    """Every image token kept; fused with the target feature like text (EAGLE-2)."""

    needs_scores = False

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        slots = torch.arange(image_embeds.shape[0], device=image_embeds.device)
        return CompressedImage(image_embeds, slots, fused=True)


class Bypass(Identity):
    """Every image token kept as the raw image embedding, bypassing fc (MSD's modality decoupling)."""

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        out = super().forward(image_embeds)
        out.fused = False
        return out


class Drop(nn.Module):
    """The drafter sees no image token at all (text-only drafting)."""

    needs_scores = False

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        empty = image_embeds[:0]
        return CompressedImage(empty, torch.zeros(0, dtype=torch.long, device=image_embeds.device))


class LearnedQueryPooling(nn.Module):
    """ViSpec `imadpt`: num_q learned queries cross-attend (multi-head, non-causal) over one image; the first
    num_q - 1 outputs replace the image at its last positions, the last output is the global image vector.
    Parameter names follow upstream (`q`, `k_proj`, `v_proj`, `o_proj`)."""

    needs_scores = False

    def __init__(self, hidden_size: int, num_heads: int, num_q: int = 2, bias: bool = False):
        super().__init__()
        if num_q < 2:
            raise ValueError(f"num_q: expected >= 2 (compressed tokens + the global vector), got {num_q}")
        if hidden_size % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide hidden_size {hidden_size}")
        self.num_heads, self.head_dim, self.num_q = num_heads, hidden_size // num_heads, num_q
        self.q = nn.Parameter(torch.randn(num_q, num_heads, self.head_dim) * self.head_dim ** -0.5)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def pool(self, image_embeds: Tensor) -> Tensor:
        """[N, H] -> [num_q, H]."""
        n = image_embeds.shape[0]
        keys = self.k_proj(image_embeds).view(n, self.num_heads, self.head_dim).transpose(0, 1)  # [h, N, d]
        values = self.v_proj(image_embeds).view(n, self.num_heads, self.head_dim).transpose(0, 1)
        queries = self.q.transpose(0, 1).to(keys.dtype)  # [h, num_q, d]
        out = F.scaled_dot_product_attention(queries, keys, values)  # [h, num_q, d]
        return self.o_proj(out.transpose(0, 1).reshape(self.num_q, -1))

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        pooled = self.pool(image_embeds)
        kept = min(self.num_q - 1, image_embeds.shape[0])
        slots = torch.arange(image_embeds.shape[0] - kept, image_embeds.shape[0], device=image_embeds.device)
        return CompressedImage(pooled[:kept], slots, global_vector=pooled[-1])


class LatentQueryPooling(nn.Module):
    """FLASH latent-aware compression: |C| learned latents, softmax(C F^T / sqrt(H)) F, placed at the image's
    last |C| positions (an image with at most |C| tokens is kept whole). Fused with features like text."""

    needs_scores = False

    def __init__(self, hidden_size: int, num_latents: int = 64):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_size) * hidden_size ** -0.5)

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        n, hidden = image_embeds.shape
        k = self.latents.shape[0]
        if n <= k:
            return Identity()(image_embeds)
        weights = (self.latents.to(image_embeds.dtype) @ image_embeds.T / math.sqrt(hidden)).softmax(-1)  # [k, N]
        slots = torch.arange(n - k, n, device=image_embeds.device)
        return CompressedImage(weights @ image_embeds, slots, fused=True)


class AttentionTopK(nn.Module):
    """DREAM pruning: keep the image tokens the target attends to most (score = mean last-layer attention they
    receive), `ratio` of them (at least one), in their original order. Fused with features like text."""

    needs_scores = True

    def __init__(self, ratio: float = 0.75):
        super().__init__()
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio: expected a retention ratio in (0, 1], got {ratio}")
        self.ratio = ratio

    def forward(self, image_embeds: Tensor, scores: Tensor | None = None) -> CompressedImage:
        if scores is None:
            raise ValueError("AttentionTopK needs target attention scores for the image tokens")
        n = image_embeds.shape[0]
        keep = max(1, math.ceil(self.ratio * n))
        slots = scores.topk(keep).indices.sort().values
        return CompressedImage(image_embeds[slots], slots, fused=True)


COMPRESSORS = {"identity": Identity, "bypass": Bypass, "drop": Drop, "learned_query": LearnedQueryPooling,
               "latent_query": LatentQueryPooling, "attention_topk": AttentionTopK}
