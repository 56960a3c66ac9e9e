"""Plain autoregressive sampling through the guided target: the baseline every speculative method matches. Each
token is one `GuidedTarget.decode` step (a compiled graph in compiled mode)."""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.finite import FiniteWatch
from specmm.core.sampling import Generators, SamplingConfig, exponential, process_logits, sample
from specmm.image_ar.target import GuidedTarget


def draw(logits: Tensor, sampling: SamplingConfig, generators: Generators) -> Tensor:
    """One token per row from combined logits [B, V] in the shared sampling order."""
    if sampling.greedy:
        return logits.argmax(-1)
    return sample(process_logits(logits, sampling), generators)


@torch.no_grad()
def generate_ar(target: GuidedTarget, first_logits: Tensor, num_tokens: int, sampling: SamplingConfig,
                generators: Generators = None) -> Tensor:
    """Tokens [B, num_tokens], one target forward each after `begin` (which gave `first_logits` [B, V])."""
    watch = FiniteWatch(target, "image token")  # NaN/inf logits raise at the end (no per-token host sync)
    watch.update(first_logits, 0)
    token = draw(first_logits, sampling, generators)
    batch, vocab = first_logits.shape
    tokens = token.new_empty(batch, num_tokens)  # each token copied out at once (CUDA graphs reuse output buffers)
    tokens[:, 0] = token
    for i in range(1, num_tokens):  # noise first (what `sample` draws), then one decode step, compiled or not
        noise = None if sampling.greedy else exponential(batch, (vocab,), generators, first_logits.device)
        logits, token = target.decode(token, sampling, noise)
        watch.update(logits, i)
        tokens[:, i] = token
    watch.check()
    return tokens
