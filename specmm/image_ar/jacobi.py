"""Jacobi proposer (SJD / GSD): the target's own previous iteration drafts the next window.

Each round verifies [root, d_1 .. d_{L-1}]. After acceptance, the target outputs past the accepted prefix
(conditioned on a partly wrong prefix) are sampled and become the next drafts, each keeping the
distribution it was drawn from; the window is refilled with initialised tokens (point masses): `random`,
`repeat_left` (the token one column left) or `repeat_up` (the token one grid row up).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specmm.core.acceptance import AcceptResult
from specmm.core.drafters import accepted_tokens
from specmm.core.sampling import (
    Generators,
    SamplingConfig,
    process_logits,
    sample,
    uniform,
)
from specmm.core.target import PrefillOutput
from specmm.core.tree import DraftTree, TreeSpec
from specmm.image_ar.target import GuidedTarget

INITS = ("random", "repeat_left", "repeat_up")


class JacobiProposer:
    """Core `Drafter` for chains of `window - 1` drafts recycled from the last verify of `target`."""

    needs = frozenset()

    def __init__(self, target: GuidedTarget, window: int = 16, init: str = "random"):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"window: expected an integer >= 2 (root + drafts), got {window!r}")
        if init not in INITS:
            raise ValueError(f"init: expected one of {', '.join(INITS)}, got {init!r}")
        self.target, self.window, self.init = target, window, init
        self.vocab_size, self.device = target.vocab_size, target.device
        self.grid = target.config.grid_size
        self.draft_forwards = 0

    def check_spec(self, spec: TreeSpec) -> None:
        if spec.kind != "chain" or spec.depth != self.window - 1:
            raise ValueError(f"tree: the Jacobi proposer drafts chains of window - 1 = {self.window - 1} tokens")

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        batch = input_ids.shape[0]
        self.history = torch.zeros(batch, self.target.config.block_size + self.window, dtype=torch.long,
                                   device=input_ids.device)  # [B, N + L] known image tokens
        self.history[:, 0] = input_ids[:, -1]
        self.known = torch.ones(batch, dtype=torch.long, device=input_ids.device)  # [B] root included
        self.stale_logits: Tensor | None = None  # [B, L, V] last verify
        self.accepted = torch.zeros(batch, dtype=torch.long, device=input_ids.device)

    def _init_token(self, drafts: list[Tensor], roots: Tensor, noise: Tensor, j: int) -> Tensor:
        """Initial token for draft j (1-based) of every row: a point-mass proposal."""
        rows = torch.arange(roots.shape[0], device=roots.device)
        if self.init == "random":
            return (noise[:, j - 1] * self.vocab_size).long().clamp(max=self.vocab_size - 1)
        left = drafts[-1] if drafts else roots
        if self.init == "repeat_left":
            return left
        source = self.known - 1 + j - self.grid  # [B] image index one row up
        offset = source - (self.known - 1)  # <= 0: committed or root; 1..j-1: an earlier draft
        window = torch.stack([roots, *drafts], 1)  # [B, j]
        from_window = window.gather(1, offset.clamp(0, j - 1)[:, None])[:, 0]
        from_history = self.history[rows, source.clamp_min(0)]
        up = torch.where(offset > 0, from_window, from_history)
        return torch.where(source >= 0, up, left)

    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators) -> DraftTree:
        batch, k, device = roots.shape[0], spec.depth, roots.device
        steps = torch.arange(1, k + 1, device=device)
        if self.stale_logits is None:
            recycled = torch.zeros(batch, dtype=torch.long, device=device)
            stale = None
        else:  # draft j comes from the verify output after old node a + j
            recycled = k - self.accepted  # [B]
            index = (self.accepted[:, None] + steps).clamp(max=k)  # [B, k]
            logits = self.stale_logits.gather(1, index[:, :, None].expand(-1, -1, self.stale_logits.shape[-1]))
            stale = process_logits(logits, sampling)  # [B, k, V]
            stale_tokens = stale.argmax(-1) if sampling.greedy else sample(stale, generators)
        noise = uniform(batch, (k,), generators, device)  # [B, k]
        drafts, probs = [], []
        for j in range(1, k + 1):
            token = self._init_token(drafts, roots, noise, j)
            prob = F.one_hot(token, self.vocab_size).float()
            if stale is not None:
                use = (j <= recycled)
                token = torch.where(use, stale_tokens[:, j - 1], token)
                prob = torch.where(use[:, None], stale[:, j - 1], prob)
            drafts.append(token)
            probs.append(prob)
        nodes = torch.arange(k + 1, device=device).expand(batch, k + 1)
        draft_probs = None if sampling.greedy else torch.stack([torch.zeros_like(probs[0]), *probs], 1)
        return DraftTree(tokens=torch.stack([roots, *drafts], 1), parents=nodes - 1, depth=nodes.clone(),
                         valid=torch.ones(batch, k + 1, dtype=torch.bool, device=device), max_depth=k,
                         max_children=1, draft_probs=draft_probs)

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        new = accepted_tokens(tree, result)  # [B, k + 1]
        count = result.num_accepted + 1
        steps = torch.arange(new.shape[1], device=new.device)
        columns = (self.known[:, None] + steps).clamp(max=self.history.shape[1] - 1)
        current = self.history.gather(1, columns)
        self.history.scatter_(1, columns, torch.where(steps < count[:, None], new, current))
        self.known = self.known + count
        self.stale_logits, self.accepted = self.target.last_logits, result.num_accepted

    def select_rows(self, rows: Tensor) -> None:
        self.history, self.known, self.accepted = self.history[rows], self.known[rows], self.accepted[rows]
        if self.stale_logits is not None:
            self.stale_logits = self.stale_logits[rows]
