"""SJD's probabilistic convergence criterion: exact speculative sampling against stale Jacobi drafts.

Each draft keeps the distribution q it was drawn from (a point mass for freshly initialised tokens), so
accept with min(1, p/q) and resample from norm(max(p - q, 0)) is lossless; the recycling lives in
`JacobiProposer`. Rows accept independently (the engine is ragged), not the batch minimum as upstream.
"""

from __future__ import annotations

from torch import Tensor

from specmm.core.acceptance import ExactRule


class SJD(ExactRule):
    name = "sjd"

    def moved_mass(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        return target_probs.new_zeros(tokens.shape)


class Exact(SJD):
    """The exact rule with the reporting hook the image sampler reads (nothing is ever moved)."""

    name = "exact"
