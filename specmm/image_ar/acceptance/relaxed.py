"""Shared base of the relaxed rules: an exact rule applied to a relaxed target distribution p'.

A relaxed rule moves some target mass onto the draft token x (the set it moves is rule-specific) and then
runs exact speculative sampling against p' = p with that mass moved. The output distribution is exactly
p', so the total-variation distance to p is the moved mass, reported per decision by `moved_mass`.
"""

from __future__ import annotations

from torch import Tensor

from specmm.core.acceptance import ExactRule


class RelaxedRule(ExactRule):
    """Subclasses define `moved_set(target_probs, tokens) -> [N, V] bool` (never containing the token) and
    `exact` (True when their knobs are at zero).

    Declared greedy behaviour: "relaxed". At temperature 0 a draft x is accepted when it is the argmax of
    p' built from the temperature-1 distribution (x's own mass plus the moved set's), and each accepted x
    other than the target's argmax is reported as moved mass 1.
    """

    name = "relaxed"
    greedy = "relaxed"

    def diagnostics(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> dict[str, Tensor]:
        return {"moved_mass": self.moved_mass(target_probs, tokens)}

    def moved_set(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        raise NotImplementedError

    def _moved(self, target_probs: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The moved set's tokens that carry mass [N, V] bool, and that mass [N]."""
        moved = self.moved_set(target_probs, tokens) & (target_probs > 0)
        return moved, (target_probs * moved).sum(-1)

    @staticmethod
    def _relax(target_probs: Tensor, tokens: Tensor, moved: Tensor, mass: Tensor) -> Tensor:
        return target_probs.masked_fill(moved, 0.0).scatter_add(-1, tokens[:, None], mass[:, None])

    def relaxed(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        """[N, V] p': the moved set's mass added to p(x), the set itself zeroed."""
        return self._relax(target_probs, tokens, *self._moved(target_probs, tokens))

    def moved_mass(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        """[N] TV(p, p') for drafts `tokens`: the mass moved onto them."""
        return self._moved(target_probs, tokens)[1]

    def decide(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor
               ) -> tuple[Tensor, dict[str, Tensor]]:
        """`accept_probability` and `diagnostics` from one moved-set computation."""
        moved, mass = self._moved(target_probs, tokens)
        relaxed = self._relax(target_probs, tokens, moved, mass)
        accept_p = super().accept_probability(relaxed, draft_probs, tokens)
        return accept_p, ({} if self.exact else {"moved_mass": mass})

    def greedy_match(self, target_logits: Tensor, tokens: Tensor) -> Tensor:
        relaxed = self.relaxed(target_logits.float().softmax(-1), tokens)
        return relaxed.gather(-1, tokens[:, None])[:, 0] >= relaxed.max(-1).values

    def accept_probability(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        return super().accept_probability(self.relaxed(target_probs, tokens), draft_probs, tokens)

    def reject(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        return super().reject(self.relaxed(target_probs, tokens), draft_probs, tokens)
