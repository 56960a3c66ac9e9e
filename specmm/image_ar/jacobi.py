"""Jacobi proposer (SJD / GSD): the target's own previous iteration drafts the next window.

Each round verifies [root, d_1 .. d_{L-1}]. After acceptance, the target outputs past the accepted prefix
(conditioned on a partly wrong prefix) are sampled and become the next drafts, each keeping the
distribution it was drawn from; the window is refilled with initialised tokens (point masses): `random`,
`repeat_left` (the token one column left) or `repeat_up` (the token one grid row up). The draft itself is a
module (`JacobiDraft`) run on draws made beforehand, traced into the round's graph in the fast mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specmm.core.acceptance import AcceptResult
from specmm.core.drafters import accepted_tokens
from specmm.core.compiled import StaticPlan
from specmm.core.inplace import write_columns_
from specmm.core.resident import owner_of, resident
from specmm.core.sampling import (
    Generators,
    SamplingConfig,
    exponential,
    process_logits,
    sample_with_noise,
    uniform,
)
from specmm.core.target import PrefillOutput
from specmm.core.tree import DraftTree, TreeSpec
from specmm.image_ar.compiled import part
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
        self.grid = target.grid_size
        self.draft_forwards = 0
        self.static_plan: StaticPlan | None = None  # set by the engine in the fast mode

    def check_spec(self, spec: TreeSpec) -> None:
        if spec.kind != "chain" or spec.depth != self.window - 1:
            raise ValueError(f"tree: the Jacobi proposer drafts chains of window - 1 = {self.window - 1} tokens")

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        batch = input_ids.shape[0]
        history = torch.zeros(batch, self.target.tokens_per_image + self.window, dtype=torch.long,
                              device=input_ids.device)  # [B, N + L] known image tokens
        history[:, 0] = input_ids[:, -1]
        # a round writes it in place: under CUDA graphs a buffer that keeps its address (else the trees skip the round)
        mode = self.static_plan.mode if self.static_plan is not None else None
        self.history = resident(owner_of(self), "jacobi_history", history, mode)
        self.known = torch.ones(batch, dtype=torch.long, device=input_ids.device)  # [B] root included
        self.stale_logits: Tensor | None = None  # [B, L, V] last verify
        self.accepted = torch.zeros(batch, dtype=torch.long, device=input_ids.device)

    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators) -> DraftTree:
        batch, k, device = roots.shape[0], spec.depth, roots.device
        stale_noise = None  # draws first, in eager order: the recycled drafts' noise, then the initialisation noise
        if self.stale_logits is not None and not sampling.greedy:
            stale_noise = exponential(batch, (k, self.vocab_size), generators, device)  # [B, k, V]
        noise = uniform(batch, (k,), generators, device)  # [B, k]
        tokens, draft_probs = part(self.target.owner, JacobiDraft)(roots=roots, noise=noise,
                                  stale_logits=self.stale_logits, stale_noise=stale_noise, accepted=self.accepted,
                                  known=self.known, history=self.history, k=k, init=self.init, grid=self.grid,
                                  vocab=self.vocab_size, sampling=sampling)
        parents, depth, valid, ancestors = self._chain(batch, k, device)
        tree = DraftTree(tokens=tokens, parents=parents, depth=depth, valid=valid, max_depth=k, max_children=1,
                         draft_probs=draft_probs)
        tree.__dict__["ancestors"] = ancestors  # the chain's (cached property): no per-round mask building
        return tree

    def _chain(self, batch: int, k: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """parents, depth, valid [B, k + 1] and ancestors [B, k + 1, k + 1] of a chain, made once per shape."""
        if getattr(self, "_chain_key", None) != (batch, k, device):
            nodes = torch.arange(k + 1, device=device).expand(batch, k + 1)
            ancestors = torch.ones(k + 1, k + 1, dtype=torch.bool, device=device).tril().expand(batch, -1, -1)
            self._chain_tensors = (nodes - 1, nodes.clone(), torch.ones(batch, k + 1, dtype=torch.bool, device=device),
                                   ancestors)
            self._chain_key = (batch, k, device)
        return self._chain_tensors

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        new = accepted_tokens(tree, result)  # [B, k + 1]
        count = result.num_accepted + 1
        steps = torch.arange(new.shape[1], device=new.device)
        columns = (self.known[:, None] + steps).clamp(max=self.history.shape[1] - 1)
        current = self.history.gather(1, columns)
        write_columns_(self.history, columns, torch.where(steps < count[:, None], new, current))
        # rows that stopped but stay in a compiled batch keep counting their root: held at the block
        self.known = (self.known + count).clamp(max=self.target.tokens_per_image)
        self.stale_logits, self.accepted = self.target.last_logits, result.num_accepted

    def select_rows(self, rows: Tensor) -> None:
        self.history, self.known, self.accepted = self.history[rows], self.known[rows], self.accepted[rows]
        if self.stale_logits is not None:
            self.stale_logits = self.stale_logits[rows]


class JacobiDraft(nn.Module):
    """The draft of one Jacobi round from its draws: recycled target samples, then initialised tokens."""

    def __init__(self, owner: nn.Module | None = None):
        super().__init__()

    def forward(self, roots: Tensor, noise: Tensor, stale_logits: Tensor | None, stale_noise: Tensor | None,
                accepted: Tensor, known: Tensor, history: Tensor, k: int, init: str, grid: int, vocab: int,
                sampling: SamplingConfig) -> tuple[Tensor, Tensor | None]:
        """roots [B], noise [B, k] U(0, 1), stale_noise [B, k, V] Exp(1) (sampling with a previous verify) ->
        tokens [B, k + 1] (root first) and draft_probs [B, k + 1, V] (None when greedy)."""
        device = roots.device
        steps = torch.arange(1, k + 1, device=device)
        stale = None
        if stale_logits is not None:  # draft j comes from the verify output after old node a + j
            recycled = k - accepted  # [B]
            index = (accepted[:, None] + steps).clamp(max=k)  # [B, k]
            logits = stale_logits.gather(1, index[:, :, None].expand(-1, -1, stale_logits.shape[-1]))
            stale = process_logits(logits, sampling)  # [B, k, V]
            stale_tokens = stale.argmax(-1) if sampling.greedy else sample_with_noise(stale, stale_noise)
        drafts, probs = [], []
        for j in range(1, k + 1):
            token = _init_token(init, drafts, roots, noise, j, known, history, grid, vocab)
            prob = F.one_hot(token, vocab).float()
            if stale is not None:
                use = (j <= recycled)
                token = torch.where(use, stale_tokens[:, j - 1], token)
                prob = torch.where(use[:, None], stale[:, j - 1], prob)
            drafts.append(token)
            probs.append(prob)
        draft_probs = None if sampling.greedy else torch.stack([torch.zeros_like(probs[0]), *probs], 1)
        return torch.stack([roots, *drafts], 1), draft_probs


def _init_token(init: str, drafts: list[Tensor], roots: Tensor, noise: Tensor, j: int, known: Tensor,
                history: Tensor, grid: int, vocab: int) -> Tensor:
    """Initial token for draft j (1-based) of every row: a point-mass proposal."""
    if init == "random":
        return (noise[:, j - 1] * vocab).long().clamp(max=vocab - 1)
    left = drafts[-1] if drafts else roots
    if init == "repeat_left":
        return left
    rows = torch.arange(roots.shape[0], device=roots.device)
    source = known - 1 + j - grid  # [B] image index one row up
    offset = source - (known - 1)  # <= 0: committed or root; 1..j-1: an earlier draft
    window = torch.stack([roots, *drafts], 1)  # [B, j]
    from_window = window.gather(1, offset.clamp(0, j - 1)[:, None])[:, 0]
    from_history = history[rows, source.clamp_min(0)]
    up = torch.where(offset > 0, from_window, from_history)
    return torch.where(source >= 0, up, left)
