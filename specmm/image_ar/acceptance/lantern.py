"""LANTERN (k, delta): credit a draft token with the mass of its nearest codebook neighbours, TV <= delta.

Neighbours N(x) are the k nearest codes of x in the L2-normalised VQ codebook (`codebook_neighbours`);
the moved set is the longest prefix of N(x) whose cumulative target mass stays <= delta, so for a deterministic
draft token (LANTERN's tree setting, tested) the output distribution p' has TV(p, p') <= delta, and delta = 0 is
exact. With drafts sampled from q, p' depends on the draft, and the output can move further than delta (0.43 at
delta = 0.2 on a 10-token toy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specmm.image_ar.acceptance.relaxed import RelaxedRule


def codebook_neighbours(codebook: Tensor, k: int, normalize: bool = True) -> Tensor:
    """[K, D] code vectors -> [K, k] indices of each code's k nearest other codes (Euclidean, ascending)."""
    if not 1 <= k < codebook.shape[0]:
        raise ValueError(f"k: expected 1 <= k < codebook size {codebook.shape[0]}, got {k}")
    vectors = F.normalize(codebook.float(), dim=-1) if normalize else codebook.float()
    rows = []
    for chunk in vectors.split(4096):  # [c, K] distances, chunked for 16k-code books
        dist = torch.cdist(chunk, vectors)
        dist.scatter_(1, torch.arange(len(rows) * 4096, len(rows) * 4096 + len(chunk),
                                      device=dist.device)[:, None], float("inf"))
        rows.append(dist.topk(k, dim=-1, largest=False).indices)
    return torch.cat(rows)


class Lantern(RelaxedRule):
    """LANTERN's additive TV budget: moved set = longest neighbour prefix with cumulative mass <= delta."""

    name = "lantern"

    def __init__(self, k: int = 1000, delta: float = 0.1, neighbours: Tensor | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: expected an integer >= 1, got {k!r}")
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta: expected a TV budget in [0, 1], got {delta!r}")
        self.k, self.delta, self.neighbours = k, float(delta), neighbours

    @property
    def exact(self) -> bool:
        return self.delta == 0.0

    @property
    def tv_bound(self) -> float | None:
        """TV(p, p') <= delta per decision, for deterministic (point-mass) drafts."""
        return self.delta

    def bind(self, codebook: Tensor) -> Lantern:
        """Compute the neighbour table from the VQ codebook [K, D] (once per model)."""
        if self.neighbours is None or self.neighbours.shape[0] != codebook.shape[0]:
            self.neighbours = codebook_neighbours(codebook, min(self.k, codebook.shape[0] - 1))
        return self

    def budget(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        return target_probs.new_full(tokens.shape, self.delta)

    def moved_set(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        if self.neighbours is None:
            raise ValueError("neighbours: call bind(codebook) (ImageSampler does) before using the rule")
        table = self.neighbours.to(tokens.device)
        near = table[tokens]  # [N, k]
        mass = target_probs.gather(-1, near).cumsum(-1)  # [N, k]
        inside = mass <= self.budget(target_probs, tokens)[:, None]  # a prefix, since mass only grows
        return torch.zeros_like(target_probs, dtype=torch.bool).scatter_(-1, near, inside)
