"""Logits -> processed probabilities, and the random draws made from them.

One processing order for draft and target alike (guidance -> temperature -> top-k -> top-p -> softmax,
in float32); temperature 0 turns the distribution into a point mass on the argmax, so greedy decoding is
just the limit case of sampling and every acceptance rule can treat both the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specmm.core.draws import DrawTape, Generators, draw

Guidance = Callable[[Tensor], Tensor]
"""A logits -> logits hook applied before temperature (e.g. classifier-free guidance)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How next tokens are drawn. `temperature=0` means greedy; `top_k=0` and `top_p=1` disable those filters."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables top-k), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):  # NaN fails too
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")

    @classmethod
    def from_generation_config(cls, config) -> SamplingConfig:
        """The sampling a HF `GenerationConfig` asks for (`do_sample` false or unset: greedy).

        The engine never reads warpers from a model's generation_config by itself (its `sampling` argument
        decides); this builds that argument from a checkpoint's settings. Warpers SamplingConfig cannot express
        (min_p, typical_p, epsilon_cutoff, eta_cutoff, top_h) are refused. Note HF's own default top_k is 50
        when a generation config leaves it unset; here unset means no top-k filter.
        """
        if not getattr(config, "do_sample", False):
            return GREEDY
        unsupported = {"min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
        for name, off in unsupported.items():
            value = getattr(config, name, None)
            if value is not None and value != off:
                raise ValueError(f"generation_config.{name}={value!r}: SamplingConfig has no {name} warper; unset it "
                                 "or build SamplingConfig(temperature, top_k, top_p) yourself")
        temperature = config.temperature if config.temperature is not None else 1.0
        return cls(temperature=float(temperature), top_k=int(config.top_k or 0),
                   top_p=float(config.top_p if config.top_p is not None else 1.0))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingConfig(temperature=0.0)


def process_logits(logits: Tensor, sampling: SamplingConfig, guidance: Guidance | None = None) -> Tensor:
    """[..., V] logits -> [..., V] float32 probabilities (point mass on the argmax when greedy)."""
    logits = logits.float()
    if guidance is not None:
        logits = guidance(logits)
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth_best = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, -math.inf)
    if sampling.top_p < 1.0:
        logits = _top_p_filter(logits, sampling.top_p)
    return logits.softmax(-1)


def _top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose mass reaches `top_p` (always at least one)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [..., V] mass of strictly better tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def normalize(probs: Tensor) -> Tensor:
    """Renormalise [..., V] non-negative weights; rows with no mass left stay all-zero."""
    total = probs.sum(-1, keepdim=True)
    return torch.where(total > 0, probs / total.clamp_min(torch.finfo(probs.dtype).tiny), probs)


def uniform(batch: int, shape: tuple[int, ...], generators: Generators, device: torch.device) -> Tensor:
    """[batch, *shape] U(0, 1) draws, row b taken from its own generator when one is given per row."""
    return draw("uniform", batch, shape, generators, device)


def exponential(batch: int, shape: tuple[int, ...], generators: Generators, device: torch.device) -> Tensor:
    """[batch, *shape] Exp(1) draws, per-row generators as in `uniform`."""
    return draw("exponential", batch, shape, generators, device)


def sample_with_noise(probs: Tensor, noise: Tensor) -> Tensor:
    """Sample [..., V] -> [...] by the exponential race argmax(p / E): exact, and no host sync."""
    return (probs / noise.clamp_min(1e-30)).argmax(-1)


def sample(probs: Tensor, generators: Generators = None) -> Tensor:
    """Draw one token per row of [B, ..., V] probabilities."""
    noise = exponential(probs.shape[0], tuple(probs.shape[1:]), generators, probs.device)
    return sample_with_noise(probs, noise)


def select_generators(generators: Generators, rows: Sequence[int]) -> Generators:
    """Keep the per-row generators of `rows` (a shared generator or None is kept as is)."""
    if generators is None or isinstance(generators, (torch.Generator, DrawTape)):
        return generators
    return [generators[r] for r in rows]
