"""GSD: grouped speculative decoding. A draft x is accepted with min(1, p(G)/q(G)) for a dynamic group G(x).

G(x) holds the tokens ranked near x by the target (a rank window), whose probability is close to p(x)
(gap < p_gap) and whose code vector is close to x's (squared distance < d_max, calibrated on the model's
own codebook by `calibrate`). On rejection the point-wise residual norm(max(p - q, 0)) is used, as
upstream. A window of 1 gives singleton groups: the exact rule.

Declared greedy behaviour: "relaxed": at temperature 0 a draft x is accepted when the target's argmax is in
G(x) (groups built from the temperature-1 distribution); each accepted x other than the argmax is moved mass 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specmm.core.acceptance import ExactRule


class GSD(ExactRule):
    name = "gsd"
    greedy = "relaxed"
    tv_bound = None  # no per-decision TV bound is claimed (the point-wise residual is upstream's choice)

    def __init__(self, window: int = 14, p_gap: float = 0.15, d_max: float | None = None,
                 embeddings: Tensor | None = None, quantile: float = 0.05):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window: expected an integer >= 1 (1 = singleton groups, exact), got {window!r}")
        if not p_gap >= 0:
            raise ValueError(f"p_gap: expected >= 0, got {p_gap!r}")
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile: expected in (0, 1], got {quantile!r}")
        self.window, self.p_gap, self.d_max, self.embeddings = window, float(p_gap), d_max, embeddings
        self.quantile = quantile

    @property
    def exact(self) -> bool:
        """Singleton groups (window 1, or no probability gap allowed) make GSD the exact rule."""
        return self.window == 1 or self.p_gap == 0.0 or self.d_max == 0.0

    def diagnostics(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> dict[str, Tensor]:
        return _group_diagnostics(target_probs, self.group(target_probs, tokens), tokens)

    def bind(self, codebook: Tensor, quantile: float | None = None) -> GSD:
        """Use the L2-normalised codebook as the token embedding; set d_max to a quantile of pair distances."""
        self.embeddings = F.normalize(codebook.float(), dim=-1)
        if self.d_max is None:
            self.d_max = calibrate_distance(self.embeddings, quantile or self.quantile)
        return self

    def group(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        """[N, V] bool: G(x) for each draft (always containing x)."""
        _rows, vocab = target_probs.shape
        order = torch.argsort(target_probs, dim=-1, descending=True, stable=True)  # [N, V]
        # x's place in that order, counted instead of a second sort: tokens more probable, then equal ones before it
        p_x = target_probs.gather(-1, tokens[:, None])  # [N, 1]
        earlier = torch.arange(vocab, device=tokens.device) < tokens[:, None]  # [N, V]
        before = (target_probs > p_x) | ((target_probs == p_x) & earlier)
        rank = before.sum(-1, keepdim=True)  # [N, 1]
        offsets = torch.arange(self.window, device=tokens.device) - self.window // 2
        near = order.gather(-1, (rank + offsets).clamp(0, vocab - 1))  # [N, W]
        keep = (target_probs.gather(-1, near) - p_x).abs() < self.p_gap
        if self.embeddings is not None and self.d_max is not None:
            emb = self.embeddings.to(target_probs.device)
            keep &= (emb[near] - emb[tokens][:, None]).pow(2).sum(-1) < self.d_max
        group = torch.zeros_like(target_probs, dtype=torch.bool).scatter_(-1, near, keep)
        return group.scatter_(-1, tokens[:, None], True)

    def moved_mass(self, target_probs: Tensor, tokens: Tensor) -> Tensor:
        """[N] mass of the group beyond the draft itself (what the group test credits to x)."""
        return _credited(target_probs, self.group(target_probs, tokens), tokens)

    def greedy_match(self, target_logits: Tensor, tokens: Tensor) -> Tensor:
        probs = target_logits.float().softmax(-1)
        best = target_logits.argmax(-1)
        return self.group(probs, tokens).gather(-1, best[:, None])[:, 0]

    def accept_probability(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        return self._accept_group(target_probs, draft_probs, self.group(target_probs, tokens))

    def decide(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor
               ) -> tuple[Tensor, dict[str, Tensor]]:
        """`accept_probability` and `diagnostics` from one group computation (one sort of the target)."""
        group = self.group(target_probs, tokens)
        diagnostics = {} if self.exact else _group_diagnostics(target_probs, group, tokens)
        return self._accept_group(target_probs, draft_probs, group), diagnostics

    @staticmethod
    def _accept_group(target_probs: Tensor, draft_probs: Tensor | None, group: Tensor) -> Tensor:
        """[N] min(1, p(G)/q(G)), or p(G) for point-mass drafts."""
        p_group = (target_probs * group).sum(-1)
        if draft_probs is None:
            return p_group.clamp(max=1.0)
        q_group = (draft_probs * group).sum(-1)
        return (p_group / q_group.clamp_min(torch.finfo(q_group.dtype).tiny)).clamp(max=1.0)


def _group_diagnostics(target_probs: Tensor, group: Tensor, tokens: Tensor) -> dict[str, Tensor]:
    """What GSD records per decision: the mass its group credits to the draft and the group's size, each [N]."""
    return {"moved_mass": _credited(target_probs, group, tokens), "group_size": group.sum(-1).float()}


def _credited(target_probs: Tensor, group: Tensor, tokens: Tensor) -> Tensor:
    """[N] target mass of each group [N, V] beyond its draft token."""
    return (target_probs * group).sum(-1) - target_probs.gather(-1, tokens[:, None])[:, 0]


def calibrate_distance(embeddings: Tensor, quantile: float = 0.05, sample: int = 2048) -> float:
    """The `quantile` of squared distances between distinct code vectors (a subsample for big codebooks)."""
    rows = embeddings[torch.linspace(0, len(embeddings) - 1, min(sample, len(embeddings))).long()]
    dist = torch.cdist(rows, embeddings).pow(2)
    off_diagonal = dist[dist > 0]
    return float(off_diagonal.quantile(quantile)) if off_diagonal.numel() else 0.0
