"""The contract every acceptance rule honours, in the style of diffusers' `SchedulerCommonTest`.

A rule's test class inherits `AcceptanceRuleCommonTest` and says how to build the rule (`make_rule`, with
`zero_knobs` the settings that must make it exact and `relaxed_knobs` settings that relax it). The
inherited tests check:
- the declarations (`exact`, `greedy`, `tv_bound`) are well-formed;
- knobs at zero equal the exact rule, decision by decision and on whole trees;
- the greedy behaviour is the declared one ("argmax", "relaxed" or "refuse");
- the TV bound holds where the rule claims one, on the exact output distribution of one decision;
- relaxed rules report as moved mass what they moved;
- the same seed gives the same outcome;
- a chain's batched walk equals the tree walk, decision for decision;
- `decide` (what the walks call) answers as `accept_probability` and `diagnostics` asked apart.
"""

from __future__ import annotations

import pytest
import torch

from specmm.core.acceptance import (
    EXACT,
    accept,
    accept_greedy,
    accept_sampled,
    decide,
    sampled_draws,
    walk_chain,
    walk_tree,
)
from specmm.core.sampling import SamplingConfig, normalize
from specmm.core.tree import DraftTree
from tests.core.test_tree import random_tree

VOCAB = 12


def distributions(seed: int, rows: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random target probs [rows, V], draft probs [rows, V] and draft tokens [rows] drawn from the draft."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(rows, VOCAB, generator=gen, dtype=torch.float64) * 2, -1)
    draft = torch.softmax(torch.randn(rows, VOCAB, generator=gen, dtype=torch.float64) * 2, -1)
    tokens = torch.multinomial(draft, 1, generator=gen)[:, 0]
    return target, draft, tokens


def one_decision_output(rule, target_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[N, V] exact output distribution of one decision on a point-mass draft: accept x with a, else residual."""
    accept_p = rule.accept_probability(target_probs, None, tokens)  # [N]
    residual = normalize(rule.reject(target_probs, None, tokens))
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_probs)
    point = torch.zeros_like(target_probs).scatter_(-1, tokens[:, None], 1.0)
    return accept_p[:, None] * point + (1 - accept_p[:, None]) * residual


def random_chain(seed: int, batch: int = 8, depth: int = 6, sampled: bool = True) -> tuple[DraftTree, torch.Tensor]:
    """A ragged batch of chains, nodes in shuffled order, some rows cut short by invalid nodes, drafts mostly
    drawn from the target (so long prefixes are accepted); and the target probs [B, T, V] after each node."""
    gen = torch.Generator().manual_seed(seed)
    nodes = depth + 1
    order = torch.stack([torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(depth, generator=gen) + 1])
                         for _ in range(batch)])  # [B, D+1] node at each depth
    parents, node_depth = torch.full((batch, nodes), -1), torch.zeros(batch, nodes, dtype=torch.long)
    rows = torch.arange(batch)[:, None]
    parents[rows, order[:, 1:]] = order[:, :-1]
    node_depth[rows, order] = torch.arange(nodes)
    length = torch.randint(0, depth + 1, (batch,), generator=gen)  # valid drafts per row
    valid = node_depth <= length[:, None]
    target = torch.softmax(torch.randn(batch, nodes, VOCAB, generator=gen, dtype=torch.float64) * 2, -1)
    jitter = torch.randn(batch, nodes, VOCAB, generator=gen, dtype=torch.float64) * 0.5
    draft = torch.softmax(torch.log(target) + jitter, -1)
    parent_draft = draft[rows, parents.clamp_min(0)]  # each node is drawn from q after its parent
    tokens = torch.multinomial(parent_draft.flatten(0, 1), 1, generator=gen).view(batch, nodes)
    tree = DraftTree(tokens=tokens, parents=parents, depth=node_depth, valid=valid, max_depth=depth, max_children=1,
                     draft_probs=parent_draft if sampled else None)
    return tree, target


def tree_with_draft_probs(seed: int, sampled: bool) -> DraftTree:
    tree = random_tree(batch=4, nodes=9, seed=seed)
    tree.tokens = tree.tokens % VOCAB
    if sampled:
        gen = torch.Generator().manual_seed(seed + 100)
        tree.draft_probs = torch.softmax(torch.randn(4, 9, VOCAB, generator=gen) * 2, -1)
    return tree


class AcceptanceRuleCommonTest:
    """Inherit and define `make_rule(**knobs)`, `zero_knobs` and `relaxed_knobs`."""

    zero_knobs: dict = {}
    relaxed_knobs: dict = {}
    reports_moved_mass_as_tv = False  # the output is exactly p' and moved_mass is TV(p, p')

    def make_rule(self, **knobs):
        raise NotImplementedError

    def test_declarations_are_well_formed(self):
        for knobs in (self.zero_knobs, self.relaxed_knobs):
            rule = self.make_rule(**knobs)
            assert isinstance(rule.exact, bool)
            assert rule.greedy in ("argmax", "relaxed", "refuse")
            assert rule.tv_bound is None or rule.tv_bound >= 0
            if rule.exact:
                assert rule.tv_bound in (None, 0.0)

    def test_zero_knobs_declare_exact_and_equal_the_exact_rule(self):
        rule = self.make_rule(**self.zero_knobs)
        assert rule.exact
        for seed in range(3):
            target, draft, tokens = distributions(seed)
            for q in (None, draft):
                torch.testing.assert_close(rule.accept_probability(target, q, tokens),
                                           EXACT.accept_probability(target, q, tokens))
                torch.testing.assert_close(normalize(rule.reject(target, q, tokens)),
                                           normalize(EXACT.reject(target, q, tokens)))

    @pytest.mark.parametrize("sampled", [False, True], ids=["point-mass", "sampled-drafts"])
    def test_zero_knobs_walk_trees_like_the_exact_rule(self, sampled):
        rule = self.make_rule(**self.zero_knobs)
        for seed in range(3):
            tree = tree_with_draft_probs(seed, sampled)
            probs = torch.softmax(torch.randn(4, 9, VOCAB, generator=torch.Generator().manual_seed(seed)), -1)
            mine = accept_sampled(tree, probs, rule, torch.Generator().manual_seed(seed))
            exact = accept_sampled(tree, probs, EXACT, torch.Generator().manual_seed(seed))
            assert torch.equal(mine.path, exact.path) and torch.equal(mine.next_token, exact.next_token)
            assert all(float(v.sum()) == 0.0 for k, v in mine.diagnostics.items() if k == "moved_mass")

    def test_greedy_behaviour_is_the_declared_one(self):
        rule = self.make_rule(**self.relaxed_knobs)
        for seed in range(4):
            tree = random_tree(batch=4, nodes=9, seed=seed)
            tree.tokens = tree.tokens % VOCAB
            logits = torch.randn(4, 9, VOCAB, generator=torch.Generator().manual_seed(seed))
            greedy = SamplingConfig(temperature=0.0)
            if rule.greedy == "refuse":
                with pytest.raises(ValueError, match="temperature 0"):
                    accept(tree, logits, greedy, rule)
                continue
            mine, exact = accept(tree, logits, greedy, rule), accept_greedy(tree, logits, EXACT)
            if rule.greedy == "argmax":
                assert torch.equal(mine.path, exact.path) and torch.equal(mine.next_token, exact.next_token)
                continue
            # relaxed: the argmax path is always acceptable, so the relaxed path is at least as long
            assert bool((mine.num_accepted >= exact.num_accepted).all())
            rows = torch.arange(4)
            nodes = mine.path[:, 1:]  # [B, D]
            argmax = logits.argmax(-1).gather(1, mine.path[:, :-1])  # [B, D] argmax after each parent
            accepted = torch.arange(nodes.shape[1])[None, :] < mine.num_accepted[:, None]
            off_argmax = (tree.tokens[rows[:, None], nodes] != argmax) & accepted
            assert torch.equal(mine.diagnostics["moved_mass"], off_argmax.float())

    def test_tv_bound_holds_where_claimed(self):
        rule = self.make_rule(**self.relaxed_knobs)
        for seed in range(3):
            target, _, tokens = distributions(seed)
            output = one_decision_output(rule, target, tokens)
            tv = 0.5 * (output - target).abs().sum(-1)
            if rule.exact:
                torch.testing.assert_close(output, target)
            if rule.tv_bound is not None:
                assert bool((tv <= rule.tv_bound + 1e-9).all())
            if self.reports_moved_mass_as_tv:
                torch.testing.assert_close(rule.diagnostics(target, None, tokens)["moved_mass"], tv)

    @pytest.mark.parametrize("per_row", [False, True], ids=["shared-generator", "per-row-generators"])
    def test_same_seed_same_outcome(self, per_row):
        rule = self.make_rule(**self.relaxed_knobs)
        tree = tree_with_draft_probs(0, sampled=True)
        probs = torch.softmax(torch.randn(4, 9, VOCAB, generator=torch.Generator().manual_seed(1)), -1)

        def run():
            gens = ([torch.Generator().manual_seed(7 + i) for i in range(4)] if per_row
                    else torch.Generator().manual_seed(7))
            return accept_sampled(tree, probs, rule, gens)

        first, second = run(), run()
        assert torch.equal(first.path, second.path) and torch.equal(first.next_token, second.next_token)
        assert first.diagnostics.keys() == second.diagnostics.keys()
        for name in first.diagnostics:
            assert torch.equal(first.diagnostics[name], second.diagnostics[name])

    @pytest.mark.parametrize("sampled", [False, True], ids=["point-mass", "sampled-drafts"])
    def test_chain_walk_equals_the_tree_walk(self, sampled):
        """`accept_sampled` walks a chain in one batched decision; same draws -> same path, token, diagnostics."""
        rule = self.make_rule(**self.relaxed_knobs)
        for seed in range(4):
            tree, probs = random_chain(seed, sampled=sampled)
            coins, noise = sampled_draws(tree, VOCAB, torch.Generator().manual_seed(seed), probs.device)
            fast, slow = walk_chain(tree, probs, rule, coins, noise), walk_tree(tree, probs, rule, coins, noise)
            assert torch.equal(fast.path, slow.path) and torch.equal(fast.num_accepted, slow.num_accepted)
            assert torch.equal(fast.next_token, slow.next_token)
            assert fast.diagnostics.keys() == slow.diagnostics.keys()
            for name in fast.diagnostics:
                torch.testing.assert_close(fast.diagnostics[name], slow.diagnostics[name], rtol=0, atol=1e-12)
            assert 0 < int(slow.num_accepted.sum()) and bool((slow.num_accepted < tree.max_depth).any())

    def test_decide_answers_as_the_two_questions_asked_apart(self):
        """A rule's own `decide` shares work between its answers; both must equal the separate methods'."""
        for knobs in (self.zero_knobs, self.relaxed_knobs):
            rule = self.make_rule(**knobs)
            for seed in range(3):
                target, draft, tokens = distributions(seed)
                for q in (None, draft):
                    accept_p, diagnostics = decide(rule, target, q, tokens)
                    torch.testing.assert_close(accept_p, rule.accept_probability(target, q, tokens), rtol=0, atol=0)
                    expected = {} if rule.exact else rule.diagnostics(target, q, tokens)
                    assert diagnostics.keys() == expected.keys()
                    for name in expected:
                        torch.testing.assert_close(diagnostics[name], expected[name], rtol=0, atol=0)
