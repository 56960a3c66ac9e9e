"""The reference choice f(state) of stepwise decoding, and the ranking SSD drafts from.

f: among masked positions of the current semi-autoregressive block (the first block that still has a
mask), the one with the highest confidence; token = argmax there. Confidence is computed from a float64
softmax; ties go to the lowest position (then the lowest token id). SSD's draft is the same ranking read
further down, so its first item is f(state) by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

CONFIDENCES = ("p_max", "margin", "neg_entropy")
_FAR = 1 << 40  # block index of positions that are never eligible


def scores(logits: Tensor, mask_id: int, confidence: str = "p_max") -> tuple[Tensor, Tensor]:
    """logits [N, G, V] -> (confidence [N, G] float64, argmax token [N, G]); the mask token is never predicted."""
    logits = logits.double().index_fill(-1, torch.tensor([mask_id], device=logits.device), -torch.inf)
    probs = logits.softmax(-1)  # [N, G, V]
    top, tokens = probs.max(-1)  # first index on ties
    if confidence == "p_max":
        return top, tokens
    if confidence == "margin":
        two = probs.topk(2, dim=-1).values
        return two[..., 0] - two[..., 1], tokens
    return (probs * probs.clamp_min(1e-300).log()).sum(-1), tokens  # neg_entropy


def blocks(masked: Tensor, block_length: int) -> tuple[Tensor, Tensor]:
    """masked [N, G] -> (block index of every position [G], current block of every row [N])."""
    g = masked.shape[1]
    index = torch.arange(g, device=masked.device)
    first = torch.where(masked, index, g).min(-1).values  # [N] first masked position (g: none)
    return index // block_length, first // block_length


def eligible(masked: Tensor, block_length: int) -> Tensor:
    """[N, G] masked positions of each row's current block."""
    block_of, current = blocks(masked, block_length)
    return masked & (block_of[None] == current[:, None])


def select(conf: Tensor, tokens: Tensor, masked: Tensor, block_length: int) -> tuple[Tensor, Tensor, Tensor]:
    """f(state): (position [N], token [N], valid [N]); valid is False for rows without masks."""
    allowed = eligible(masked, block_length)
    pos = torch.where(allowed, conf, -torch.inf).argmax(-1)  # [N] first maximum: lowest position on ties
    return pos, tokens.gather(1, pos[:, None])[:, 0], allowed.any(-1)


def rank(conf: Tensor, tokens: Tensor, masked: Tensor, block_length: int, n: int, cross_blocks: bool
         ) -> tuple[Tensor, Tensor, Tensor]:
    """The first `n` (position, token) pairs in block order, then confidence, then position: [N, n] x3.

    Item 0 is `select`'s choice. `cross_blocks=False` stops at the end of the current block.
    """
    block_of, current = blocks(masked, block_length)
    ok = masked & (block_of[None] == current[:, None]) if not cross_blocks else masked
    key = torch.where(ok, block_of[None], _FAR)  # [N, G]
    order = torch.sort(torch.where(ok, conf, -torch.inf), dim=-1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(key.gather(1, order), dim=-1, stable=True).indices)  # block-major
    order = order[:, :n]
    if order.shape[1] < n:  # fewer positions than asked
        order = torch.cat((order, order[:, -1:].expand(-1, n - order.shape[1])), dim=1)
        valid = torch.arange(n, device=conf.device)[None] < masked.shape[1]
        valid = valid & (key.gather(1, order) < _FAR)
    else:
        valid = key.gather(1, order) < _FAR
    return order, tokens.gather(1, order), valid
