"""After any sequence of accepts and rejects, each row's cache equals a fresh prefill of its accepted tokens: for the
`RowCache` over HF's DynamicCache and for the `SlotRowCache` (row_slots), whose sub-batches are views."""

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


@pytest.mark.parametrize("row_slots", [False, True])
@pytest.mark.parametrize("arch", ["llama", "mistral", "phi3"])
def test_cache_equals_fresh_prefill_after_random_accepts_and_rejects(arch, row_slots):
    model = tiny_model(arch, dtype=torch.float32)
    target = HFCausalLMTarget(model)
    target.row_slots = row_slots
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


def chain_block(rows: list[list[int]], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens [B, W] with rows[b] real ones (left-aligned) -> (input_ids, valid)."""
    width = max(max(rows, default=0), 1)
    ids = torch.randint(1, VOCAB, (len(rows), width), generator=gen)
    valid = torch.arange(width)[None, :] < torch.tensor(rows)[:, None]
    return ids, valid


def assert_rows_read_as_fresh_prefills(model, target, history: list[list[int]], gen: torch.Generator) -> None:
    """One random root per row, verified: each row's logits equal a fresh prefill of its history and the root."""
    batch = len(history)
    roots = torch.randint(1, VOCAB, (batch,), generator=gen)
    tree = DraftTree(tokens=roots[:, None], parents=torch.full((batch, 1), -1),
                     depth=torch.zeros(batch, 1, dtype=torch.long), valid=torch.ones(batch, 1, dtype=torch.bool),
                     max_depth=0, max_children=1)
    logits = target.verify(tree).logits[:, 0]
    for b in range(batch):
        assert (logits[b] - fresh_logits(model, history[b] + [roots[b].item()])).abs().max() < 1e-5
    assert target.runner.cache.lengths.tolist() == [len(h) for h in history]


@pytest.mark.parametrize("row_slots", [False, True])
def test_chains_rewinds_and_row_moves_keep_every_row_equal_to_a_fresh_prefill(row_slots):
    """open_chain/keep_chain keep a prefix of ragged blocks, rewind forgets committed tokens, and a sub-batch
    taken out, run and put back leaves every row as a fresh prefill of its tokens."""
    model = tiny_model("mistral", dtype=torch.float32)  # sliding window: masks across chains and moves
    target = HFCausalLMTarget(model)
    target.row_slots = row_slots
    ids, mask = left_padded_batch([5, 1, 8, 3], seed=2)
    gen = torch.Generator().manual_seed(1)
    target.start(ids.shape[0])
    target.prefill(ids, mask)
    history = [row[m.bool()].tolist() for row, m in zip(ids, mask)]

    def run_chain(owner, rows, lengths, keep):
        blocks = [chain_block(n, gen) for n in lengths]
        logits = [owner.open_chain(block, valid).logits for block, valid in blocks]
        seen = [[] for _ in rows]
        for (block, valid), out in zip(blocks, logits):  # each chain token sees the rows' earlier chain tokens
            for i, b in enumerate(rows):
                for j in valid[i].nonzero().flatten().tolist():
                    seen[i].append(block[i, j].item())
                    expected = fresh_logits(model, history[b] + seen[i])
                    assert (out[i, j] - expected).abs().max() < 1e-5
        owner.keep_chain(torch.tensor(keep))
        for i, b in enumerate(rows):
            history[b] += seen[i][: keep[i]]

    run_chain(target, [0, 1, 2, 3], [[2, 0, 3, 1], [1, 2, 0, 2]], keep=[3, 1, 0, 2])  # judge-like suffixes dropped
    target.rewind(torch.tensor([1, 0, 0, 2]))
    for b, n in enumerate([1, 0, 0, 2]):
        history[b] = history[b][: len(history[b]) - n]
    part_rows = torch.tensor([3, 0])
    part = target.take_rows(part_rows)
    run_chain(part, [3, 0], [[9, 4], [3, 3]], keep=[12, 5])  # the part grows past the batch's longest row
    part.rewind(torch.tensor([0, 2]))
    history[0] = history[0][:-2]
    target.put_rows(part_rows, part)
    assert_rows_read_as_fresh_prefills(model, target, history, gen)


def test_slot_views_share_the_buffers_and_rows_copied_in_from_another_cache_read_as_a_fresh_prefill():
    """row_slots: `take_rows` is a view (its writes land in the batch's buffers, `put_rows` copies no states), a
    view of a view addresses the right rows, and rows written over from a separately prefilled adapter (a
    refill) continue as fresh prefills of their new prompts."""
    from specmm.core.slot_cache import SlotRowCache

    model = tiny_model("llama", dtype=torch.float32)
    target = HFCausalLMTarget(model)
    target.row_slots = True
    ids, mask = left_padded_batch([4, 7, 2, 5], seed=3)
    gen = torch.Generator().manual_seed(4)
    target.start(4)
    target.prefill(ids, mask)
    history = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    home = target.runner.cache
    assert isinstance(home, SlotRowCache)

    part = target.take_rows(torch.tensor([3, 1, 2]))
    inner = part.take_rows(torch.tensor([2, 0]))  # rows 2 and 3 of the batch
    assert inner.runner.cache.stores is home.stores
    block, valid = chain_block([3, 1], gen)
    inner.open_chain(block, valid)
    inner.keep_chain(torch.tensor([2, 1]))
    history[2] += block[0, :2].tolist()
    history[3] += block[1, :1].tolist()
    stored = [store.keys.clone() for store in home.stores]
    part.put_rows(torch.tensor([2, 0]), inner)
    target.put_rows(torch.tensor([3, 1, 2]), part)
    assert all(torch.equal(a, b.keys) for a, b in zip(stored, home.stores)), "put_rows of a view copies no states"

    joining = HFCausalLMTarget(model)
    joining.row_slots = True
    new_ids, new_mask = left_padded_batch([6], seed=9)
    joining.start(1)
    joining.prefill(new_ids, new_mask)
    target.put_rows(torch.tensor([1]), joining)
    history[1] = new_ids[0][new_mask[0].bool()].tolist()

    assert_rows_read_as_fresh_prefills(model, target, history, gen)
