"""LANTERN++ (k, lambda): LANTERN's neighbour credit with a multiplicative bound p'(x) <= lambda p(x).

Used with static draft trees (`lantern_pp_tree`), where low-confidence drafts still get deep paths.
lambda = 1 is exact.
"""

from __future__ import annotations

from torch import Tensor

from specmm.image_ar.acceptance.lantern import Lantern


class LanternPP(Lantern):
    name = "lantern++"

    def __init__(self, k: int = 10, lam: float = 5.0, neighbours: Tensor | None = None):
        if not lam >= 1.0:
            raise ValueError(f"lam: expected lambda >= 1 (1 is exact), got {lam!r}")
        super().__init__(k=k, delta=1.0, neighbours=neighbours)
        self.lam = float(lam)

    @property
    def exact(self) -> bool:
        return self.lam == 1.0

    @property
    def tv_bound(self) -> float | None:
        """No additive bound: the claim is multiplicative, p'(x) <= lambda p(x)."""
        return None

    def budget(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        return (self.lam - 1.0) * target_probs.gather(-1, tokens[:, None])[:, 0]
