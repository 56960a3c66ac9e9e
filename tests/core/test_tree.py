"""Tree tensors match brute force; the dynamic builder is EAGLE-2's selection."""

from __future__ import annotations

import itertools

import pytest
import torch

import specmm
from specmm.core.sampling import SamplingConfig
from specmm.core.tree import DraftTree, ancestor_mask, grow_tree, limit_depth


def random_tree(batch=3, nodes=9, seed=0) -> DraftTree:
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, nodes), -1)
    depth = torch.zeros(batch, nodes, dtype=torch.long)
    for b, i in itertools.product(range(batch), range(1, nodes)):
        parents[b, i] = torch.randint(0, i, (1,), generator=gen)
        depth[b, i] = depth[b, parents[b, i]] + 1
    return DraftTree(tokens=torch.randint(0, 50, (batch, nodes), generator=gen), parents=parents, depth=depth,
                     valid=torch.ones(batch, nodes, dtype=torch.bool), max_depth=int(depth.max()), max_children=nodes)


def ancestors_brute(parents_row):
    out = []
    for i in range(len(parents_row)):
        chain, j = {i}, i
        while parents_row[j] >= 0:
            j = int(parents_row[j])
            chain.add(j)
        out.append(chain)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_ancestor_mask_children_and_paths_match_brute_force(seed):
    tree = random_tree(seed=seed)
    for b in range(tree.tokens.shape[0]):
        parents = tree.parents[b].tolist()
        for i, chain in enumerate(ancestors_brute(parents)):
            assert set(tree.ancestors[b, i].nonzero().flatten().tolist()) == chain
            kids = [j for j in range(len(parents)) if parents[j] == i]
            assert [c for c in tree.children[b, i].tolist() if c >= 0] == kids
            path = tree.path_to(torch.full((tree.tokens.shape[0],), i))[b, : tree.depth[b, i] + 1].tolist()
            assert path == sorted(chain)


@pytest.mark.parametrize("seed", range(2))
def test_compiled_ancestor_mask_is_the_eager_one_past_the_gather_depth(seed):
    """Compiled, trees deeper than `GATHER_MAX_DEPTH` read parents' rows by a one-hot product (inductor inlined the
    gathers of a chain's folded `arange - 1` parents into minutes of index algebra at depth 8): the same mask as
    eager for a chain made inside the graph, and for a deep random tree with a node cut loose and one past the
    depth limit, which keep their own rows."""
    from specmm.core.tree import GATHER_MAX_DEPTH

    def chain(length: int) -> torch.Tensor:
        nodes = torch.arange(length).expand(2, length)
        return ancestor_mask(nodes - 1, nodes.clone(), length - 1)

    length = GATHER_MAX_DEPTH + 4
    compiled_chain = torch.compile(chain, backend="aot_eager", dynamic=False, fullgraph=True)
    assert torch.equal(compiled_chain(length), torch.ones(2, length, length, dtype=torch.bool).tril())
    tree = random_tree(nodes=12, seed=seed)
    while tree.max_depth <= GATHER_MAX_DEPTH:  # a spine deep enough for the one-hot path
        tree = random_tree(nodes=12, seed=seed + 100 * (tree.max_depth + 1))
    depth = tree.depth.clone()
    depth[:, -1] = tree.max_depth + 1  # past the limit: never inherits
    parents = tree.parents.clone()
    parents[:, 1] = -1  # cut loose, at depth 1: takes row 0's as the clamped root
    eager = ancestor_mask(parents, depth, tree.max_depth)
    compiled = torch.compile(ancestor_mask, backend="aot_eager", dynamic=False, fullgraph=True)
    assert torch.equal(compiled(parents, depth, tree.max_depth), eager)
    assert torch.equal(eager[:, -1], torch.eye(12, dtype=torch.bool)[-1].expand(3, 12))


def test_static_spec_orders_paths_and_links_parents():
    spec = specmm.TreeSpec.static([[1, 0], [0], [1], [0, 0], [0, 0, 2], [0, 0, 0], [0, 0, 1]])
    parents, ranks, depths = spec.static_layout
    assert [list(c) for c in spec.choices] == [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 2]]
    assert parents == [-1, 0, 0, 1, 2, 3, 3, 3] and ranks == [0, 0, 1, 0, 0, 0, 1, 2]
    assert depths == [0, 1, 1, 2, 2, 3, 3, 3] and spec.num_nodes == 8 and spec.top_k == 3


class TableDrafter:
    """A drafter whose logits depend only on the node's token: logits = table[token]."""

    def __init__(self, vocab=12, seed=0):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2
        self.calls = 0

    def expand(self, tokens, parent_slots):
        self.calls += 1
        return self.table[tokens]


def eagle2_reference(table, root, depth, top_k, total):
    """EAGLE-2 by brute force: frontier of top-k cumulative scores per level, then the global best nodes."""
    logp = table.log_softmax(-1)
    pool = []  # (score, path)
    frontier = [(0.0, (root,))]
    for level in range(1, depth + 1):
        candidates = []
        for score, path in frontier:
            values, tokens = logp[path[-1]].topk(top_k)
            candidates += [(score + v.item(), path + (t.item(),)) for v, t in zip(values, tokens)]
        pool += candidates
        frontier = sorted(candidates, key=lambda c: -c[0])[:top_k]
    best = sorted(pool, key=lambda c: -c[0])[: total - 1]
    return {path[1:] for _, path in best}


@pytest.mark.parametrize("depth, top_k, total", [(3, 2, 7), (4, 3, 14), (2, 4, 20)])
def test_dynamic_tree_is_eagle2_selection(depth, top_k, total):
    drafter = TableDrafter()
    roots = torch.tensor([3, 7])
    spec = specmm.TreeSpec.dynamic(depth=depth, top_k=top_k, total_tokens=total)
    tree = grow_tree(spec, roots, drafter.table[roots], drafter.expand, SamplingConfig(0.0))
    assert drafter.calls == depth - 1 and tree.num_nodes == total
    for b, root in enumerate(roots.tolist()):
        paths = set()
        for i in range(1, total):
            path = tree.path_to(torch.full((2,), i))[b, 1: tree.depth[b, i] + 1]
            paths.add(tuple(tree.tokens[b, path].tolist()))
        assert paths == eagle2_reference(drafter.table, root, depth, top_k, total)
        assert (tree.parents[b, 1:] < torch.arange(1, total)).all()  # parents precede children


def test_static_tree_takes_the_ranked_tokens_of_each_parent():
    drafter = TableDrafter()
    spec = specmm.TreeSpec.static([[0], [1], [0, 0], [0, 2], [1, 1]])
    roots = torch.tensor([5])
    tree = grow_tree(spec, roots, drafter.table[roots], drafter.expand, SamplingConfig(0.0))
    ranked = lambda token: drafter.table[token].topk(3).indices.tolist()  # noqa: E731
    first, second = ranked(5)[0], ranked(5)[1]
    assert tree.tokens[0].tolist() == [5, first, second, ranked(first)[0], ranked(first)[2], ranked(second)[1]]
    assert drafter.calls == 1  # one run for the level with children; the leaves at depth 2 never run


@pytest.mark.parametrize("seed", range(3))
def test_limit_depth_keeps_nodes_within_each_rows_budget_and_parks_the_rest_at_the_root(seed):
    tree = random_tree(seed=seed)
    tree.valid[0, -1] = False  # a drafter's own padding: its descendants must go too
    limit = torch.tensor([1, 2, 10])
    cut = limit_depth(tree, limit)
    for b in range(3):
        for i, chain in enumerate(ancestors_brute(tree.parents[b].tolist())):
            keep = all(bool(tree.valid[b, j]) and int(tree.depth[b, j]) <= int(limit[b]) for j in chain)
            assert bool(cut.valid[b, i]) == keep
            assert int(cut.depth[b, i]) == (int(tree.depth[b, i]) if keep else 0)
    kept = cut.ancestors & cut.valid[:, :, None]
    assert torch.equal(kept, tree.ancestors & cut.valid[:, :, None])  # kept nodes keep their paths
    # the carried-over ancestor table is exactly what the cut tree's own parents and depths give
    assert torch.equal(cut.ancestors, ancestor_mask(cut.parents, cut.depth, cut.max_depth))
