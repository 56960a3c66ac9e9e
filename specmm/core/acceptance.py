"""Acceptance rules: pure tensor functions from (draft tree, target distributions) to an accepted path.

A rule decides one node at a time, like a diffusers scheduler decides one step: how likely a draft token
is to be accepted under the current target distribution, and what the target distribution becomes after
it is rejected. The tree walk (`accept_sampled`) is shared; relaxed rules (LANTERN, GSD) only replace the
rule object. Draft tokens with `draft_probs=None` are point masses (deterministic top-k candidates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from specmm.core.sampling import Generators, exponential, normalize, sample_with_noise, uniform
from specmm.core.tree import DraftTree


@dataclass
class AcceptResult:
    """Outcome of verifying one tree per row."""

    path: Tensor  # [B, D+1] tree node at each depth of the accepted path, root first (junk past num_accepted)
    num_accepted: Tensor  # [B] accepted draft tokens (0..D)
    next_token: Tensor  # [B] target token after the path: the bonus, or the correction after a rejection


@runtime_checkable
class AcceptanceRule(Protocol):
    """One node's decision. Shapes: target_probs [N, V], draft_probs [N, V] or None (point mass), tokens [N]."""

    def greedy_match(self, target_logits: Tensor, tokens: Tensor) -> Tensor:
        """[N] bool: does the greedy target accept `tokens`?"""
        ...

    def accept_probability(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        """[N] probability of accepting `tokens`."""
        ...

    def reject(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        """[N, V] target weights after rejecting `tokens` (renormalised by the caller)."""
        ...


class ExactRule:
    """Lossless speculative sampling: accept with min(1, p(x)/q(x)); on reject continue with norm(max(p - q, 0)).

    With a point-mass draft this is: accept with p(x); on reject zero p(x) and renormalise, so several
    deterministic siblings can be tried in turn (EAGLE-2 / SpecInfer recursive rejection).
    """

    def greedy_match(self, target_logits: Tensor, tokens: Tensor) -> Tensor:
        return target_logits.argmax(-1) == tokens

    def accept_probability(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        p_x = target_probs.gather(-1, tokens[:, None])[:, 0]
        if draft_probs is None:
            return p_x
        q_x = draft_probs.gather(-1, tokens[:, None])[:, 0]
        return (p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)

    def reject(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> Tensor:
        if draft_probs is None:
            return target_probs.scatter(-1, tokens[:, None], 0.0)
        return (target_probs - draft_probs).clamp_min(0.0)


EXACT = ExactRule()


def accept_greedy(tree: DraftTree, target_logits: Tensor, rule: AcceptanceRule = EXACT) -> AcceptResult:
    """Longest root-to-node path whose every token the greedy target accepts; fully vectorised.

    target_logits: [B, T, V], row i holding the target's logits after node i.
    """
    batch, nodes, vocab = target_logits.shape
    parents = tree.parents.clamp_min(0)
    if isinstance(rule, ExactRule):
        parent_argmax = target_logits.argmax(-1).gather(1, parents)  # [B, T]
        ok = tree.tokens == parent_argmax
    else:
        parent_logits = target_logits.gather(1, parents[:, :, None].expand(batch, nodes, vocab))
        ok = rule.greedy_match(parent_logits.flatten(0, 1), tree.tokens.flatten()).view(batch, nodes)
    ok = (ok & tree.valid) | (tree.parents < 0)
    accepted = ~((~ok)[:, None, :] & tree.ancestors).any(-1)  # [B, T]: every ancestor-or-self ok
    idx = torch.arange(nodes, device=ok.device)
    rank = tree.depth * nodes + (nodes - 1 - idx)  # deepest first, then lowest index
    best = torch.where(accepted, rank, -1).argmax(-1)  # [B]
    rows = torch.arange(batch, device=ok.device)
    return AcceptResult(path=tree.path_to(best), num_accepted=tree.depth[rows, best],
                        next_token=target_logits[rows, best].argmax(-1))


def accept_sampled(tree: DraftTree, target_probs: Tensor, rule: AcceptanceRule = EXACT,
                   generators: Generators = None) -> AcceptResult:
    """Walk each row's tree from the root, trying children in sibling order (recursive rejection).

    target_probs: [B, T, V] processed target distribution after each node. All random draws are made up
    front (per row when per-row generators are given), so the walk has no host sync.
    """
    batch, nodes, vocab = target_probs.shape
    device = target_probs.device
    depth_levels, width = tree.max_depth, tree.max_children
    coins = uniform(batch, (max(depth_levels, 1), width), generators, device)  # [B, D, C]
    noise = exponential(batch, (vocab,), generators, device)  # [B, V] for the final token
    rows = torch.arange(batch, device=device)
    children = tree.children  # [B, T, C]
    current = torch.zeros(batch, dtype=torch.long, device=device)
    walking = torch.ones(batch, dtype=torch.bool, device=device)
    probs = target_probs[:, 0]  # [B, V] distribution the next child is tested against
    for level in range(depth_levels):
        moved = torch.zeros_like(walking)
        chosen = current.clone()
        for j in range(width):
            child = children[rows, current, j]  # [B]
            trying = walking & ~moved & (child >= 0)
            node = child.clamp_min(0)
            token = tree.tokens[rows, node]
            q = None if tree.draft_probs is None else tree.draft_probs[rows, node]
            accept = trying & (coins[:, level, j] < rule.accept_probability(probs, q, token))
            reject = trying & ~accept
            residual = normalize(rule.reject(probs, q, token))
            residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)  # no mass left: keep p
            probs = torch.where(reject[:, None], residual, probs)
            moved |= accept
            chosen = torch.where(accept, child, chosen)
        current = chosen
        probs = torch.where(moved[:, None], target_probs[rows, current], probs)
        walking &= moved
    return AcceptResult(path=tree.path_to(current), num_accepted=tree.depth[rows, current],
                        next_token=sample_with_noise(probs, noise))
