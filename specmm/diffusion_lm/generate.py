"""`specmm.diffusion_lm.generate`: semi-autoregressive masked-diffusion decoding with one of several methods.

Lossless: `stepwise` (the reference) and `ssd` (identical tokens, fewer forwards). Lossy baselines:
`low_confidence` (LLaDA, k tokens per step), `threshold` (Fast-dLLM parallel decoding), `prophet`
(early commit). All are greedy (temperature 0) and fill exactly `gen_length` positions.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specmm.core.stats import GenerationStats
from specmm.diffusion_lm.adapters import as_diffusion_lm
from specmm.diffusion_lm.parallel import (
    decode_parallel,
    prophet_rule,
    stepwise_rule,
    threshold_rule,
    top_k_rule,
)
from specmm.diffusion_lm.runner import CACHE_MODES, Runner
from specmm.diffusion_lm.selection import CONFIDENCES
from specmm.diffusion_lm.ssd import decode_ssd

METHODS = ("stepwise", "ssd", "low_confidence", "threshold", "prophet")
LOSSLESS = ("stepwise", "ssd")


@dataclass
class DiffusionOutput:
    sequences: Tensor  # [B, prompt_len + gen_length]: the prompt as given, then the generated tokens
    stats: GenerationStats  # with `diffusion` extras; every row commits gen_length tokens


def _context_limit(model) -> int | None:
    config = getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)
    for name in ("max_sequence_length", "max_position_embeddings"):
        if config is not None and getattr(config, name, None):
            return int(getattr(config, name))
    return None


def _vocab_size(model) -> int | None:
    config = getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)
    size = getattr(config, "vocab_size", None) if config is not None else None
    return int(size) if isinstance(size, int) else None


def _is_count(value) -> bool:
    """An integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check(model, input_ids, attention_mask, gen_length, block_length, method, cache, draft_size, tree_width,
           confidence, tokens_per_step, threshold, prophet_thresholds) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids: expected a LongTensor [batch, prompt_len]")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids: empty batch")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask: shape {shape} != input_ids {tuple(input_ids.shape)}")
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError("attention_mask: expected 0 (padding) and 1 (prompt token) only")
        if input_ids.shape[1] and not bool((attention_mask[:, -1] == 1).all()):
            raise ValueError("attention_mask: the last column must be all ones (pad prompts on the left: the "
                             "generated tokens follow the prompt)")
    vocab = _vocab_size(model)
    if vocab is not None:
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
            raise ValueError(f"input_ids: token ids must be in [0, {vocab}) (the model's vocabulary)")
        if not 0 <= model.mask_id < vocab:
            raise ValueError(f"mask_id: {model.mask_id} is outside the model's vocabulary [0, {vocab})")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if not _is_count(gen_length):
        raise ValueError(f"gen_length: expected an integer >= 1, got {gen_length!r}")
    if not _is_count(block_length) or gen_length % block_length:
        raise ValueError(f"block_length: must be >= 1 and divide gen_length {gen_length}, got {block_length!r}")
    if not (isinstance(prophet_thresholds, (tuple, list)) and len(prophet_thresholds) == 3
            and all(isinstance(t, (int, float)) and not math.isnan(t) for t in prophet_thresholds)):
        raise ValueError(f"prophet_thresholds: expected three margins (early, middle, late; inf: never), got "
                         f"{prophet_thresholds!r}")
    if cache not in CACHE_MODES:
        raise ValueError(f"cache: expected None or 'prefix', got {cache!r}")
    if cache is not None and not getattr(model, "supports_cache", False):
        raise ValueError(f"cache: {type(model).__name__} has no prefix cache; use MaskedDiffusionLM or cache=None")
    if confidence not in CONFIDENCES:
        raise ValueError(f"confidence: expected one of {', '.join(CONFIDENCES)}, got {confidence!r}")
    if not (_is_count(draft_size) and _is_count(tree_width) and _is_count(tokens_per_step)):
        raise ValueError(f"draft_size, tree_width, tokens_per_step: must be >= 1, got {draft_size}, {tree_width}, "
                         f"{tokens_per_step}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold: expected a confidence in (0, 1], got {threshold}")
    limit = _context_limit(model)
    if limit is not None and input_ids.shape[1] + gen_length > limit:
        raise ValueError(f"input_ids: prompt length {input_ids.shape[1]} + gen_length {gen_length} exceeds the "
                         f"model's context of {limit} positions")
    if attention_mask is not None and bool(((input_ids == model.mask_id) & (attention_mask == 0)).any()):
        raise ValueError(f"input_ids: padding uses the mask id {model.mask_id}; pad with another token")


def generate(model, input_ids: Tensor, gen_length: int = 128, block_length: int = 32, method: str = "ssd", *,
             attention_mask: Tensor | None = None, mask_id: int | None = None, cache: str | None = None,
             draft_size: int = 8, tree_width: int = 1, confidence: str = "p_max", tokens_per_step: int = 2,
             threshold: float = 0.9, prophet_thresholds: tuple[float, float, float] = (7.5, 5.0, 2.5)
             ) -> DiffusionOutput:
    """Fill `gen_length` masks after `input_ids` [B, P] (left padded with `attention_mask`), block by block.

    ssd: `draft_size` chain candidates per forward, `tree_width` - 1 extra leaves per chain node.
    cache: None or "prefix" (Fast-dLLM prefix cache; SSD is exact against stepwise under the same mode).
    """
    model = as_diffusion_lm(model, mask_id)
    _check(model, input_ids, attention_mask, gen_length, block_length, method, cache, draft_size, tree_width,
           confidence, tokens_per_step, threshold, prophet_thresholds)
    device = input_ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    runner = Runner(model, input_ids, attention_mask, gen_length, block_length, cache)
    x = torch.cat((input_ids, input_ids.new_full((input_ids.shape[0], gen_length), model.mask_id)), dim=1)  # [B, L]
    if method == "ssd":
        x = decode_ssd(runner, x, draft_size, tree_width, confidence)
    else:
        rule = {"stepwise": lambda: stepwise_rule(block_length),
                "low_confidence": lambda: top_k_rule(block_length, tokens_per_step),
                "threshold": lambda: threshold_rule(block_length, threshold),
                "prophet": lambda: prophet_rule(block_length, gen_length, prophet_thresholds)}[method]()
        x = decode_parallel(runner, x, rule, confidence)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    runner.stats.wall_time_s = time.perf_counter() - started
    runner.stats.new_tokens_per_row = [gen_length] * input_ids.shape[0]
    runner.stats.new_tokens = input_ids.shape[0] * gen_length
    return DiffusionOutput(x, runner.stats)
