"""Plain autoregressive sampling through the guided target: the baseline every speculative method matches."""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.finite import FiniteWatch
from specmm.core.sampling import Generators, SamplingConfig, process_logits, sample
from specmm.core.tree import DraftTree
from specmm.image_ar.target import GuidedTarget


def draw(logits: Tensor, sampling: SamplingConfig, generators: Generators) -> Tensor:
    """One token per row from combined logits [B, V] in the shared sampling order."""
    if sampling.greedy:
        return logits.argmax(-1)
    return sample(process_logits(logits, sampling), generators)


def root_tree(tokens: Tensor) -> DraftTree:
    """A one-node tree per row: verifying it is one plain decoding step."""
    zeros = torch.zeros_like(tokens)[:, None]
    return DraftTree(tokens=tokens[:, None], parents=zeros - 1, depth=zeros, valid=torch.ones_like(zeros).bool(),
                     max_depth=0, max_children=1)


@torch.no_grad()
def generate_ar(target: GuidedTarget, first_logits: Tensor, num_tokens: int, sampling: SamplingConfig,
                generators: Generators = None) -> Tensor:
    """Tokens [B, num_tokens], one target forward each after `begin` (which gave `first_logits` [B, V])."""
    watch = FiniteWatch(target, "image token")  # NaN/inf logits raise at the end (no per-token host sync)
    watch.update(first_logits, 0)
    token = draw(first_logits, sampling, generators)
    tokens = [token]
    for i in range(1, num_tokens):
        logits = target.verify(root_tree(token)).logits[:, 0]
        watch.update(logits, i)
        target.commit(torch.zeros_like(token)[:, None], torch.ones_like(token))
        token = draw(logits, sampling, generators)
        tokens.append(token)
    watch.check()
    return torch.stack(tokens, 1)
