"""After any sequence of accepts and rejects, each row's cache equals a fresh prefill of its accepted tokens."""

from __future__ import annotations

import pytest
import torch

from specmm.core.target import HFCausalLMTarget
from specmm.core.tree import DraftTree
from tests.conftest import VOCAB, left_padded_batch, tiny_model

NODES = 7
ROUNDS = 6


def random_tree(roots: torch.Tensor, gen: torch.Generator) -> DraftTree:
    """A different random tree per row: node i hangs under a random earlier node."""
    batch = roots.shape[0]
    parents = torch.full((batch, NODES), -1)
    depth = torch.zeros(batch, NODES, dtype=torch.long)
    for b in range(batch):
        for i in range(1, NODES):
            parents[b, i] = torch.randint(0, i, (1,), generator=gen)
            depth[b, i] = depth[b, parents[b, i]] + 1
    tokens = torch.randint(1, VOCAB, (batch, NODES), generator=gen)
    tokens[:, 0] = roots
    return DraftTree(tokens=tokens, parents=parents, depth=depth, valid=torch.ones(batch, NODES, dtype=torch.bool),
                     max_depth=int(depth.max()), max_children=NODES)


def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("arch", ["llama", "mistral", "phi3"])
def test_cache_equals_fresh_prefill_after_random_accepts_and_rejects(arch):
    model = tiny_model(arch, dtype=torch.float32)
    target = HFCausalLMTarget(model)
    ids, mask = left_padded_batch([4, 9, 1, 6], seed=5)  # row 2: a one-token prompt, nothing to prefill
    gen = torch.Generator().manual_seed(0)
    target.start(ids.shape[0])
    target.prefill(ids[:, :-1], mask[:, :-1])
    history = [row[m.bool()].tolist()[:-1] for row, m in zip(ids, mask)]  # committed tokens per live row
    roots = ids[:, -1]
    worst = 0.0
    for round_ in range(ROUNDS + 1):
        tree = random_tree(roots, gen)
        logits = target.verify(tree).logits  # [B, T, V]
        for b in range(len(history)):
            for node in range(NODES):
                path = tree.path_to(torch.tensor([node]).expand(tree.tokens.shape[0]))[b, : tree.depth[b, node] + 1]
                expected = fresh_logits(model, history[b] + tree.tokens[b, path].tolist())
                worst = max(worst, (logits[b, node] - expected).abs().max().item())
        if round_ == ROUNDS:
            break
        chosen = torch.randint(0, NODES, (len(history),), generator=gen)  # any node: accepts and rejects
        path = tree.path_to(chosen)
        counts = tree.depth[torch.arange(len(history)), chosen] + 1
        target.commit(path, counts)
        for b in range(len(history)):
            history[b] += tree.tokens[b, path[b, : counts[b]]].tolist()
        roots = torch.randint(1, VOCAB, (len(history),), generator=gen)
        if round_ == 2:  # a row leaves the batch mid-generation
            keep = torch.tensor([0, 2, 3])
            target.select_rows(keep)
            history = [history[i] for i in keep.tolist()]
            roots = roots[keep]
    assert worst < 1e-5, f"largest logit gap to a fresh prefill: {worst:.2e}"
    lengths = target.runner.cache.lengths.tolist()
    assert lengths == [len(h) for h in history]
    assert target.runner.cache.committed_length == max(lengths), "stale slots must not pile up"


def test_selecting_rows_of_an_empty_cache_keeps_later_appends_consistent():
    from specmm.core.cache import RowCache

    cache = RowCache(3, torch.device("cpu"))
    empty = torch.randn(3, 2, 0, 8)  # e.g. one-token prompts: a layer initialised with nothing in it
    cache.cache.update(empty, empty.clone(), 0)
    assert cache.physical_length == 0
    cache.select_rows(torch.tensor([0, 2]))
    more = torch.randn(2, 2, 1, 8)
    out_keys, _ = cache.cache.update(more, more.clone(), 0)
    assert out_keys.shape == (2, 2, 1, 8) and torch.equal(out_keys, more)
