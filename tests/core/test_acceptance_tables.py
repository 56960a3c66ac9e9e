"""Literal tables of draft, target and output tokens, in the style of vLLM's rejection-sampler tests.

Each row of a table is one batch row: the draft chain, what the target says after the root and after each
draft, and the tokens the round must commit (accepted drafts, then the correction or bonus token).
"""

from __future__ import annotations

import pytest
import torch

from specmm.core.acceptance import EXACT, accept_greedy, accept_sampled
from specmm.core.drafters import accepted_tokens
from specmm.core.tree import DraftTree

VOCAB = 10


def chain_tree(drafts: list[list[int]], draft_probs: torch.Tensor | None = None) -> DraftTree:
    """A batch of chains [B, k] under root token 0."""
    batch, k = len(drafts), len(drafts[0])
    nodes = torch.arange(k + 1).expand(batch, k + 1)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), torch.tensor(drafts)], 1)
    return DraftTree(tokens=tokens, parents=nodes - 1, depth=nodes.clone(),
                     valid=torch.ones(batch, k + 1, dtype=torch.bool), max_depth=k, max_children=1,
                     draft_probs=draft_probs)


def one_hot_logits(target: list[list[int]]) -> torch.Tensor:
    """[B, k+1, V] logits whose argmax after node i is target[b][i]."""
    return torch.nn.functional.one_hot(torch.tensor(target), VOCAB).float() * 10


def committed(tree: DraftTree, result) -> list[list[int]]:
    tokens = accepted_tokens(tree, result)
    return [row[: n + 1].tolist() for row, n in zip(tokens, result.num_accepted)]


GREEDY_TABLE = [
    # drafts        target after root, d1, d2, d3     committed
    ([1, 2, 3],     [1, 2, 3, 4],                     [1, 2, 3, 4]),  # all accepted, bonus 4
    ([1, 2, 3],     [1, 5, 3, 4],                     [1, 5]),  # second draft rejected, correction 5
    ([1, 2, 3],     [7, 2, 3, 4],                     [7]),  # first draft rejected
    ([1, 1, 1],     [1, 1, 2, 9],                     [1, 1, 2]),  # third rejected
    ([9, 9, 9],     [9, 9, 9, 9],                     [9, 9, 9, 9]),
]


@pytest.mark.parametrize("drafts,target,expected", GREEDY_TABLE)
def test_greedy_table_one_row(drafts, target, expected):
    tree = chain_tree([drafts])
    assert committed(tree, accept_greedy(tree, one_hot_logits([target]), EXACT)) == [expected]


def test_greedy_table_as_one_ragged_batch():
    tree = chain_tree([d for d, _, _ in GREEDY_TABLE])
    result = accept_greedy(tree, one_hot_logits([t for _, t, _ in GREEDY_TABLE]), EXACT)
    assert committed(tree, result) == [e for _, _, e in GREEDY_TABLE]
    assert result.num_accepted.tolist() == [3, 1, 0, 2, 3]


def point_mass(tokens: list[list[int]]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), VOCAB).double()


# Sampled drafts with point-mass target distributions: every decision is certain, so the outcome is a table.
# p(x) = 1 accepts; p(x) = 0 rejects and the residual norm(max(p - q, 0)) is the target's own point mass.
SAMPLED_TABLE = [
    # drafts     target point mass after root, d1, d2   committed
    ([4, 5],     [4, 5, 6],                             [4, 5, 6]),
    ([4, 5],     [4, 2, 6],                             [4, 2]),
    ([4, 5],     [3, 5, 6],                             [3]),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_table_with_certain_decisions(seed):
    drafts = [d for d, _, _ in SAMPLED_TABLE]
    uniform_draft = torch.full((3, 3, VOCAB), 1.0 / VOCAB, dtype=torch.float64)  # drafts were drawn from q = uniform
    tree = chain_tree(drafts, draft_probs=uniform_draft)
    result = accept_sampled(tree, point_mass([t for _, t, _ in SAMPLED_TABLE]), EXACT,
                            torch.Generator().manual_seed(seed))
    assert committed(tree, result) == [e for _, _, e in SAMPLED_TABLE]


def test_sibling_candidates_are_tried_in_order_after_a_rejection():
    """Root with three point-mass children [1, 2, 3]; the target says 3 for sure: the first two are rejected
    (p = 0), the third accepted, then the bonus after it."""
    tokens = torch.tensor([[0, 1, 2, 3]])
    tree = DraftTree(tokens=tokens, parents=torch.tensor([[-1, 0, 0, 0]]), depth=torch.tensor([[0, 1, 1, 1]]),
                     valid=torch.ones(1, 4, dtype=torch.bool), max_depth=1, max_children=3)
    target = point_mass([[3, 8, 8, 6]])  # after root: 3; after node 3 (token 3): 6
    result = accept_sampled(tree, target, EXACT, torch.Generator().manual_seed(0))
    assert result.path[0].tolist() == [0, 3] and result.num_accepted.tolist() == [1]
    assert result.next_token.tolist() == [6]
    greedy = accept_greedy(tree, target.float().log().clamp_min(-1e4))
    assert greedy.path[0].tolist() == [0, 3] and greedy.next_token.tolist() == [6]
