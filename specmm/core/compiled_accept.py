"""The acceptance walk of a fast-mode round, in a form dynamo traces into the round's graph.

`accept_traceable` does what `specmm.core.acceptance.accept` does, for any rule and sampling config. Random
draws (`sampled_draws`) are made first, in the eager walk's order (from a round's draw tape when the round is one
graph), so a compiled round draws exactly the tokens an eager one does; the walk itself builds the ancestor and
child tables as plain fields (`TracedTree`), which dynamo can follow where it cannot follow `cached_property`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from specmm.core.acceptance import (AcceptanceRule, AcceptResult, accept_greedy, accept_sampled, check_rule,
                                    sampled_draws)
from specmm.core.sampling import Generators, SamplingConfig, process_logits
from specmm.core.tree import DraftTree, ancestor_mask, children_table


@dataclass
class TracedTree(DraftTree):
    """A DraftTree with its ancestor and child tables as plain fields: dynamo cannot trace `cached_property`."""

    ancestors: Tensor | None = None  # [B, T, T]
    children: Tensor | None = None  # [B, T, C]


class AcceptWalk(nn.Module):
    """The acceptance walk of one round: greedy, or sampled from draws made beforehand."""

    def __init__(self, owner: nn.Module | None = None):
        super().__init__()

    def forward(self, tokens: Tensor, parents: Tensor, depth: Tensor, valid: Tensor, draft_probs: Tensor | None,
                logits: Tensor, coins: Tensor | None, noise: Tensor | None, max_depth: int, max_children: int,
                sampling: SamplingConfig, rule: AcceptanceRule):
        """tokens, parents, depth, valid: [B, T]; draft_probs: [B, T, V] or None; logits: [B, T, V] raw;
        coins: [B, D, C] and noise: [B, V] from `sampled_draws` (None when greedy)."""
        tree = TracedTree(tokens=tokens, parents=parents, depth=depth, valid=valid, max_depth=max_depth,
                          max_children=max_children, draft_probs=draft_probs,
                          ancestors=ancestor_mask(parents, depth, max_depth),
                          children=children_table(parents, valid, max_children))
        if sampling.greedy:
            result = accept_greedy(tree, logits, rule)
        else:
            result = accept_sampled(tree, process_logits(logits, sampling), rule, draws=(coins, noise))
        return result.path, result.num_accepted, result.next_token, result.diagnostics


WALK = AcceptWalk()


def accept_traceable(tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rule: AcceptanceRule,
                     generators: Generators) -> AcceptResult:
    """`accept(tree, target_logits, sampling, rule, generators)`, traceable into a compiled round."""
    check_rule(rule, sampling)
    coins = noise = None
    if not sampling.greedy:
        coins, noise = sampled_draws(tree, target_logits.shape[-1], generators, target_logits.device)
    path, num_accepted, next_token, diagnostics = WALK(
        tokens=tree.tokens, parents=tree.parents, depth=tree.depth, valid=tree.valid, draft_probs=tree.draft_probs,
        logits=target_logits, coins=coins, noise=noise, max_depth=tree.max_depth, max_children=tree.max_children,
        sampling=sampling, rule=rule)
    return AcceptResult(path=path, num_accepted=num_accepted, next_token=next_token, diagnostics=dict(diagnostics))
