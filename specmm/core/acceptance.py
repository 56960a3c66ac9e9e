"""Acceptance rules: pure tensor functions from (draft tree, target distributions) to an accepted path.

A rule decides one node at a time, like a diffusers scheduler decides one step: how likely a draft token
is to be accepted under the current target distribution, and what the target distribution becomes after
it is rejected. The tree walk (`accept_sampled`) is shared; relaxed rules (LANTERN, GSD) only replace the
rule object. Draft tokens with `draft_probs=None` are point masses (deterministic top-k candidates).

Glossary:
- *exact rule*: the output has exactly the target's processed distribution (declared by `exact = True`).
- *relaxed rule*: the output follows a relaxed distribution p'; the rule reports TV(p, p') as `moved_mass`.
- *greedy behaviour* (`greedy`): what a rule does at temperature 0, declared, never inferred from its class:
  `"argmax"` accepts a draft iff it is the target's argmax (the exact fast path), `"relaxed"` applies the
  rule's documented `greedy_match`, `"refuse"` raises a ValueError before any forward (`greedy_hint` says
  what to use instead).
- *moved mass*: TV mass a relaxed rule moved onto an accepted draft. At temperature 0 the target is a point
  mass, so accepting any token other than its argmax moves all of it (1.0 per such token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from specmm.core.sampling import (
    Generators,
    SamplingConfig,
    exponential,
    normalize,
    process_logits,
    sample_with_noise,
    uniform,
)
from specmm.core.tree import DraftTree


@dataclass
class AcceptResult:
    """Outcome of verifying one tree per row."""

    path: Tensor  # [B, D+1] tree node at each depth of the accepted path, root first (junk past num_accepted)
    num_accepted: Tensor  # [B] accepted draft tokens (0..D)
    next_token: Tensor  # [B] target token after the path: the bonus, or the correction after a rejection
    diagnostics: dict[str, Tensor] = field(default_factory=dict)  # rule's own, each [B, D]: per accepted draft (0 past)


GreedyBehaviour = Literal["argmax", "relaxed", "refuse"]


@runtime_checkable
class AcceptanceRule(Protocol):
    """One node's decision. Shapes: target_probs [N, V], draft_probs [N, V] or None (point mass), tokens [N].

    A rule declares what it is: `exact` (lossless) and `greedy` (behaviour at temperature 0, see the
    module glossary). The engine dispatches on these declarations, never on the rule's class. A rule may also
    define `decide(target_probs, draft_probs, tokens) -> (accept_probability, diagnostics)` to compute what the two
    share once (module-level `decide` asks it; GSD and the relaxed rules do).
    """

    exact: bool
    greedy: GreedyBehaviour
    tv_bound: float | None  # per-decision TV(p, p') bound for point-mass drafts, where the rule claims one

    def diagnostics(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> dict[str, Tensor]:
        """{name: [N]} what the rule records about each decision (e.g. moved_mass); {} for exact rules."""
        ...

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

    exact: bool = True
    greedy: GreedyBehaviour = "argmax"
    greedy_hint = ""
    tv_bound: float | None = 0.0

    def diagnostics(self, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor) -> dict[str, Tensor]:
        return {}

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


def decide(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor | None, tokens: Tensor
           ) -> tuple[Tensor, dict[str, Tensor]]:
    """One batch of decisions: [N] acceptance probabilities and {name: [N]} diagnostics ({} for an exact rule).

    A rule whose two answers share work (GSD's groups, a relaxed rule's moved set) defines `decide` itself and
    computes that work once; any other rule is asked twice. Shapes as in `AcceptanceRule`.
    """
    own = getattr(rule, "decide", None)
    if own is not None:
        return own(target_probs, draft_probs, tokens)
    diagnostics = {} if rule.exact else rule.diagnostics(target_probs, draft_probs, tokens)
    return rule.accept_probability(target_probs, draft_probs, tokens), diagnostics


def check_rule(rule: AcceptanceRule, sampling: SamplingConfig) -> None:
    """Raise ValueError before any work when `rule` refuses `sampling` (temperature 0 with greedy='refuse')."""
    if sampling.greedy and rule.greedy == "refuse":
        name = getattr(rule, "name", type(rule).__name__)
        raise ValueError(f"acceptance: {name} is not defined at temperature 0. {rule.greedy_hint}".strip())


def accept(tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rule: AcceptanceRule = EXACT,
           generators: Generators = None) -> AcceptResult:
    """Verify one tree per row: the greedy walk at temperature 0, else the sampled walk.

    target_logits: [B, T, V] raw target logits after each node (processed here in the shared order).
    """
    if sampling.greedy:
        check_rule(rule, sampling)
        return accept_greedy(tree, target_logits, rule)
    return accept_sampled(tree, process_logits(target_logits, sampling), rule, generators)


def accept_greedy(tree: DraftTree, target_logits: Tensor, rule: AcceptanceRule = EXACT) -> AcceptResult:
    """Longest root-to-node path whose every token the greedy target accepts; fully vectorised.

    target_logits: [B, T, V], row i holding the target's logits after node i. A rule declared
    `greedy="argmax"` takes the argmax fast path; `greedy="relaxed"` applies its `greedy_match`, and every
    accepted draft that is not the argmax is reported as moved mass 1 (the point mass moved).
    """
    batch, nodes, vocab = target_logits.shape
    parents = tree.parents.clamp_min(0)
    parent_argmax = target_logits.argmax(-1).gather(1, parents)  # [B, T]
    if rule.greedy == "argmax":
        ok = tree.tokens == parent_argmax
    elif rule.greedy == "relaxed":
        parent_logits = target_logits.gather(1, parents[:, :, None].expand(batch, nodes, vocab))
        ok = rule.greedy_match(parent_logits.flatten(0, 1), tree.tokens.flatten()).view(batch, nodes)
    else:
        raise ValueError(f"acceptance: {type(rule).__name__} declares greedy={rule.greedy!r}; "
                         "expected 'argmax' or 'relaxed' at temperature 0")
    ok = (ok & tree.valid) | (tree.parents < 0)
    accepted = ~((~ok)[:, None, :] & tree.ancestors).any(-1)  # [B, T]: every ancestor-or-self ok
    idx = torch.arange(nodes, device=ok.device)
    rank = tree.depth * nodes + (nodes - 1 - idx)  # deepest first, then lowest index
    best = torch.where(accepted, rank, -1).argmax(-1)  # [B]
    rows = torch.arange(batch, device=ok.device)
    path = tree.path_to(best)
    num_accepted = tree.depth[rows, best]
    diagnostics = {}
    if rule.greedy == "relaxed":
        drafts = path[:, 1:]  # [B, D] accepted draft at each depth (junk past num_accepted)
        accepted_here = torch.arange(drafts.shape[1], device=ok.device)[None, :] < num_accepted[:, None]
        off_argmax = tree.tokens.gather(1, drafts) != parent_argmax.gather(1, drafts)
        diagnostics["moved_mass"] = (off_argmax & accepted_here).float()
    return AcceptResult(path=path, num_accepted=num_accepted, next_token=target_logits[rows, best].argmax(-1),
                        diagnostics=diagnostics)


def sampled_draws(tree: DraftTree, vocab: int, generators: Generators, device: torch.device) -> tuple[Tensor, Tensor]:
    """The random draws of `accept_sampled`, in its order: coins [B, D, C] and the final token's noise [B, V]."""
    batch = tree.tokens.shape[0]
    coins = uniform(batch, (max(tree.max_depth, 1), tree.max_children), generators, device)
    return coins, exponential(batch, (vocab,), generators, device)


def accept_sampled(tree: DraftTree, target_probs: Tensor, rule: AcceptanceRule = EXACT,
                   generators: Generators = None, draws: tuple[Tensor, Tensor] | None = None) -> AcceptResult:
    """Walk each row's tree from the root, trying children in sibling order (recursive rejection).

    target_probs: [B, T, V] processed target distribution after each node. All random draws are made up
    front (per row when per-row generators are given), so the walk has no host sync. A rule not declared
    exact has its `diagnostics` recorded for every accepted draft, against the distribution it was tested on.
    `draws`: the `sampled_draws` made beforehand (a compiled walk takes them as inputs). The walk is chosen
    from the tree's shape: a chain (one child per node: Jacobi windows, chain drafters) decides every draft
    in one batched rule call (`walk_chain`), any other tree level by level (`walk_tree`); both give the same
    outcome for the same draws.
    """
    vocab = target_probs.shape[-1]
    coins, noise = draws if draws is not None else sampled_draws(tree, vocab, generators, target_probs.device)
    if tree.max_children == 1 and tree.max_depth >= 1:  # a chain: every decision at once, same draws, same outcome
        return walk_chain(tree, target_probs, rule, coins, noise)
    return walk_tree(tree, target_probs, rule, coins, noise)


def walk_tree(tree: DraftTree, target_probs: Tensor, rule: AcceptanceRule, coins: Tensor, noise: Tensor
              ) -> AcceptResult:
    """The recursive-rejection walk, level by level and sibling by sibling (a later sibling is tested against
    the residual its earlier siblings left). target_probs: [B, T, V]; coins: [B, D, C]; noise: [B, V]."""
    batch, nodes, vocab = target_probs.shape
    device = target_probs.device
    depth_levels, width = tree.max_depth, tree.max_children
    rows = torch.arange(batch, device=device)
    children = tree.children  # [B, T, C]
    current = torch.zeros(batch, dtype=torch.long, device=device)
    walking = torch.ones(batch, dtype=torch.bool, device=device)
    probs = target_probs[:, 0]  # [B, V] distribution the next child is tested against
    recorded: dict[str, Tensor] = {}
    for level in range(depth_levels):
        moved = torch.zeros_like(walking)
        chosen = current.clone()
        for j in range(width):
            child = children[rows, current, j]  # [B]
            trying = walking & ~moved & (child >= 0)
            node = child.clamp_min(0)
            token = tree.tokens[rows, node]
            q = None if tree.draft_probs is None else tree.draft_probs[rows, node]
            accept_p, diagnostics = decide(rule, probs, q, token)
            accept = trying & (coins[:, level, j] < accept_p)
            reject = trying & ~accept
            for name, value in diagnostics.items():
                per_depth = recorded.setdefault(name, target_probs.new_zeros(batch, depth_levels))
                per_depth[:, level] += torch.where(accept, value.to(per_depth.dtype), 0.0)
            residual = normalize(rule.reject(probs, q, token))
            residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)  # no mass left: keep p
            probs = torch.where(reject[:, None], residual, probs)
            moved |= accept
            chosen = torch.where(accept, child, chosen)
        current = chosen
        probs = torch.where(moved[:, None], target_probs[rows, current], probs)
        walking &= moved
    return AcceptResult(path=tree.path_to(current), num_accepted=tree.depth[rows, current],
                        next_token=sample_with_noise(probs, noise), diagnostics=recorded)


def walk_chain(tree: DraftTree, target_probs: Tensor, rule: AcceptanceRule, coins: Tensor, noise: Tensor
               ) -> AcceptResult:
    """`walk_tree` for a chain (one child per node), with all D decisions in one batched rule call.

    In a chain each draft is tested against its parent's own distribution (no sibling ever leaves a residual),
    so decision l is `coins[:, l, 0] < a(p_l, q_l, x_l)` for every l at once; the accepted prefix is where
    all decisions so far hold, and only the first rejection's residual is built. The draws and therefore the
    tokens are those of `walk_tree`. target_probs: [B, T, V]; coins: [B, D, 1]; noise: [B, V].
    """
    batch, _nodes, vocab = target_probs.shape
    levels = tree.max_depth
    rows = torch.arange(batch, device=target_probs.device)
    first_child = tree.children[:, :, 0]  # [B, T], -1 where a node has no (valid) child
    chain = [torch.zeros_like(rows)]  # node at each depth, -1 past the chain's end
    for _ in range(levels):
        chain.append(torch.where(chain[-1] >= 0, first_child[rows, chain[-1].clamp_min(0)], -1))
    nodes = torch.stack(chain, 1)  # [B, D+1]
    parent, child = nodes[:, :-1].clamp_min(0), nodes[:, 1:]  # [B, D] each
    exists = child >= 0
    child = child.clamp_min(0)
    parent_probs = target_probs[rows[:, None], parent].flatten(0, 1)  # [B*D, V]
    draft_probs = None if tree.draft_probs is None else tree.draft_probs[rows[:, None], child].flatten(0, 1)
    tokens = tree.tokens.gather(1, child)  # [B, D]
    accept_p, diagnostics = decide(rule, parent_probs, draft_probs, tokens.flatten())
    accepted = (exists & (coins[:, :levels, 0] < accept_p.view(batch, levels))).long().cumprod(-1).bool()  # [B, D]
    num_accepted = accepted.sum(-1)  # [B] the accepted prefix's length
    current = nodes.gather(1, num_accepted[:, None])[:, 0]  # [B] deepest accepted node
    recorded = {name: torch.where(accepted, value.view(batch, levels).to(target_probs.dtype), 0.0)
                for name, value in diagnostics.items()}
    # the first rejection, if any: the next token comes from its residual, else from the last node's p
    stop = num_accepted.clamp(max=levels - 1)  # [B]
    rejected = (num_accepted < levels) & exists.gather(1, stop[:, None])[:, 0]
    probs = target_probs[rows, current]  # [B, V]
    stop_draft = None if draft_probs is None else draft_probs.view(batch, levels, vocab)[rows, stop]
    residual = normalize(rule.reject(probs, stop_draft, tokens[rows, stop]))
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)  # no mass left: keep p
    probs = torch.where(rejected[:, None], residual, probs)
    return AcceptResult(path=tree.path_to(current), num_accepted=num_accepted,  # current's depth
                        next_token=sample_with_noise(probs, noise), diagnostics=recorded)
