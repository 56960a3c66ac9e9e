"""Acceptance rules as pure functions: greedy matches brute force; sampled verification leaves p unchanged."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specmm.core.acceptance import ExactRule, accept_greedy, accept_sampled
from specmm.core.tree import DraftTree
from tests.core.test_tree import random_tree


def test_greedy_acceptance_takes_the_longest_path_the_target_agrees_with():
    for seed in range(5):
        tree = random_tree(batch=4, nodes=10, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(4, 10, 50, generator=gen)
        tree.tokens[:, 1:] = torch.where(torch.rand(4, 9, generator=gen) < 0.6,  # agree often, not always
                                         logits.argmax(-1).gather(1, tree.parents[:, 1:]), tree.tokens[:, 1:])
        result = accept_greedy(tree, logits)
        for b in range(4):
            best, best_depth = 0, 0
            for node in range(10):
                path, ok = [node], True
                while tree.parents[b, path[-1]] >= 0:
                    path.append(int(tree.parents[b, path[-1]]))
                for child in path[:-1]:
                    ok &= tree.tokens[b, child].item() == logits[b, tree.parents[b, child]].argmax().item()
                if ok and tree.depth[b, node] > best_depth:
                    best, best_depth = node, int(tree.depth[b, node])
            assert result.num_accepted[b] == best_depth
            assert result.next_token[b] == logits[b, best].argmax()


def chain(batch, tokens, draft_probs=None):
    k = tokens.shape[1]
    nodes = torch.arange(k + 1).expand(batch, k + 1)
    return DraftTree(tokens=torch.cat([torch.zeros(batch, 1, dtype=torch.long), tokens], 1), parents=nodes - 1,
                     depth=nodes.clone(), valid=torch.ones(batch, k + 1, dtype=torch.bool), max_depth=k,
                     max_children=1, draft_probs=draft_probs)


def first_token(tree, result):
    return torch.where(result.num_accepted > 0, tree.tokens[:, 1], result.next_token)


def test_sampled_drafts_leave_the_target_distribution_unchanged():
    n = 200_000
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1, 0.0])
    q = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.1, 0.2])  # proposes a token the target never emits
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen)[:, None]
    draft_probs = torch.stack([torch.zeros(6), q])[None].expand(n, 2, 6)
    tree = chain(n, drafts, draft_probs)
    result = accept_sampled(tree, p.expand(n, 2, 6).contiguous(), generators=gen)
    counts = torch.bincount(first_token(tree, result), minlength=6)
    assert counts[5] == 0
    assert chisquare(counts[:5].numpy(), (p[:5].double() * n).numpy()).pvalue > 1e-3


def test_deterministic_siblings_tried_in_turn_leave_the_target_distribution_unchanged():
    n = 200_000
    p = torch.tensor([0.1, 0.3, 0.35, 0.05, 0.2])
    # root with three point-mass children (tokens 2, 0, 4): accept with p(x), else zero it and try the next
    tokens = torch.tensor([0, 2, 0, 4]).expand(n, 4)
    tree = DraftTree(tokens=tokens, parents=torch.tensor([-1, 0, 0, 0]).expand(n, 4),
                     depth=torch.tensor([0, 1, 1, 1]).expand(n, 4), valid=torch.ones(n, 4, dtype=torch.bool),
                     max_depth=1, max_children=3)
    result = accept_sampled(tree, p.expand(n, 4, 5).contiguous(), generators=torch.Generator().manual_seed(1))
    chosen = torch.where(result.num_accepted > 0, tree.tokens.gather(1, result.path[:, 1:2])[:, 0], result.next_token)
    counts = torch.bincount(chosen, minlength=5)
    assert chisquare(counts.numpy(), (p.double() * n).numpy()).pvalue > 1e-3
    accepted_first = (result.path[:, 1] == 1) & (result.num_accepted > 0)
    assert accepted_first.float().mean().item() == pytest.approx(0.35, abs=0.01)


class AcceptEverything(ExactRule):
    """A maximally relaxed rule, to show a rule object plugs into the shared walk."""

    def accept_probability(self, target_probs, draft_probs, tokens):
        return torch.ones_like(tokens, dtype=target_probs.dtype)


def test_a_relaxed_rule_plugs_into_the_tree_walk():
    tree = chain(8, torch.randint(0, 5, (8, 3)))
    probs = torch.full((8, 4, 5), 0.2)
    assert accept_sampled(tree, probs, rule=AcceptEverything()).num_accepted.tolist() == [3] * 8
