"""SJD's probabilistic convergence criterion: exact speculative sampling against stale Jacobi drafts.

Each draft keeps the distribution q it was drawn from (a point mass for freshly initialised tokens), so
accept with min(1, p/q) and resample from norm(max(p - q, 0)) is lossless; the recycling lives in
`JacobiProposer`. Rows accept independently (the engine is ragged), not the batch minimum as upstream.
"""

from __future__ import annotations

from specmm.core.acceptance import ExactRule


class SJD(ExactRule):
    """Declared exact, greedy behaviour "argmax" (inherited from the exact rule)."""

    name = "sjd"


class Exact(ExactRule):
    """The exact rule under its image-sampler name."""

    name = "exact"
