"""SSD is lossless: its tokens equal stepwise decoding's exactly (float64, CPU), with fewer forwards."""

from __future__ import annotations

import pytest
import torch

from specmm.diffusion_lm import generate
from tests.diffusion_lm.conftest import MASK, ToyDLM, tiny_dlm


def prompts(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (batch, length), generator=gen)


def check_same(model, ids, gen_length, block_length, **ssd_kwargs):
    cache = ssd_kwargs.get("cache")
    ref = generate(model, ids, gen_length, block_length, method="stepwise", cache=cache)
    out = generate(model, ids, gen_length, block_length, method="ssd", **ssd_kwargs)
    assert torch.equal(out.sequences, ref.sequences), ssd_kwargs
    assert not (out.sequences[:, ids.shape[1]:] == (getattr(model, "mask_id", None) or MASK)).any()
    assert all(f <= gen_length for f in out.stats.target_forwards_per_row)  # never more than stepwise, per row
    assert ref.stats.target_forwards == gen_length and ref.stats.mean_accepted == 1.0
    return ref, out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gen_length,block_length", [(16, 4), (24, 8), (12, 12), (10, 1)])
def test_ssd_equals_stepwise_on_random_llada_models(seed, gen_length, block_length):
    model = tiny_dlm(seed=seed, std=0.6)
    ids = prompts(1, 5 + seed, 39, seed)
    for draft_size, tree_width in ((1, 1), (3, 1), (8, 1), (4, 3)):
        check_same(model, ids, gen_length, block_length, draft_size=draft_size, tree_width=tree_width)


@pytest.mark.parametrize("strength", [0.05, 0.3, 3.0])
@pytest.mark.parametrize("seed", range(5))
def test_ssd_equals_stepwise_on_state_dependent_toy_models(strength, seed):
    """strength 3.0 is adversarial: every commit reshuffles the confidences of all positions."""
    model = ToyDLM(length=6 + 18, strength=strength, seed=seed)
    ids = prompts(2, 6, model.vocab, seed)
    for gen_length, block_length in ((18, 6), (18, 18), (18, 3)):
        for draft_size, tree_width in ((2, 1), (6, 1), (18, 1), (4, 4)):
            check_same(model, ids, gen_length, block_length, draft_size=draft_size, tree_width=tree_width)


def test_ssd_saves_forwards_when_predictions_are_stable():
    model = ToyDLM(length=4 + 32, strength=0.05, seed=1)
    ref, out = check_same(model, prompts(1, 4, model.vocab, 0), 32, 8, draft_size=8)
    assert out.stats.target_forwards <= ref.stats.target_forwards / 3  # nearly state-independent: most are accepted
    assert out.stats.mean_accepted >= 3.0


def test_tree_leaves_accept_more_than_the_chain_alone():
    model = ToyDLM(length=6 + 24, strength=0.6, seed=3)
    ids = prompts(4, 6, model.vocab, 3)
    _, chain = check_same(model, ids, 24, 8, draft_size=4, tree_width=1)
    _, tree = check_same(model, ids, 24, 8, draft_size=4, tree_width=4)
    assert tree.stats.new_tokens == chain.stats.new_tokens
    assert sum(tree.stats.target_forwards_per_row) < sum(chain.stats.target_forwards_per_row)


@pytest.mark.parametrize("cache", [None, "prefix"])
def test_stats_are_tokens_per_row_forward_with_accepted_drafts_and_candidate_rows(cache):
    model = ToyDLM(length=6 + 24, strength=0.6, seed=3) if cache is None else tiny_dlm(seed=1, std=0.3)
    ids = prompts(3, 6, getattr(model, "vocab", 39), 3)
    _, out = check_same(model, ids, 24, 8, draft_size=4, tree_width=2, cache=cache)
    stats = out.stats
    assert stats.new_tokens_per_row == [24] * 3 and stats.new_tokens == 72
    assert stats.row_forwards == sum(stats.target_forwards_per_row) < 72
    assert stats.mean_accepted == pytest.approx(stats.new_tokens / stats.row_forwards) and stats.mean_accepted > 1
    assert max(stats.target_forwards_per_row) <= stats.target_forwards
    # each iteration commits the token stepwise decoding would, plus accepted_histogram's index in drafts
    iterations = sum(stats.accepted_histogram)
    assert stats.accepted_drafts == stats.new_tokens - iterations > 0
    assert stats.diffusion.forward_rows > stats.row_forwards  # candidate states share a row's forward
    assert (stats.diffusion.full_forwards == stats.target_forwards) == (cache is None)
    assert stats.summary()["diffusion"] == {"full_forwards": stats.diffusion.full_forwards,
                                            "forward_rows": stats.diffusion.forward_rows}


@pytest.mark.parametrize("seed", range(4))
def test_exact_confidence_ties_break_to_the_lowest_position_in_both_decoders(seed):
    # every position predicts the same logits (rows tied) and logits are quantised: many exact ties
    model = ToyDLM(length=5 + 16, strength=0.0, seed=seed, tied_rows=True)
    ids = prompts(1, 5, model.vocab, seed)
    ref, _ = check_same(model, ids, 16, 8, draft_size=5, tree_width=2)
    tied = ToyDLM(length=5 + 16, strength=0.4, seed=seed, step=0.5, tied_rows=True)
    check_same(tied, ids, 16, 8, draft_size=5, tree_width=2)
    check_same(tied, ids, 16, 4, draft_size=16)
    # state-independent tied rows: stepwise fills left to right with the same (lowest-id) argmax token
    generated = ref.sequences[0, 5:]
    assert (generated == generated[0]).all()


def test_batched_ssd_with_left_padding_equals_stepwise_row_by_row():
    model = tiny_dlm(seed=7, std=0.6)
    ids = prompts(3, 7, 39, 7)
    attention_mask = torch.ones_like(ids)
    attention_mask[0, :3] = 0
    attention_mask[2, :1] = 0
    ids = ids.masked_fill(attention_mask == 0, 0)
    batched = generate(model, ids, 16, 4, method="ssd", draft_size=4, attention_mask=attention_mask)
    for row in range(3):
        keep = attention_mask[row].bool()
        alone = generate(model, ids[row][keep][None], 16, 4, method="stepwise")
        assert torch.equal(batched.sequences[row, 7:], alone.sequences[0, keep.sum():])
    assert batched.stats.target_forwards <= 16


@pytest.mark.parametrize("toy, gen_length, draft_size", [(False, 1, 2), (False, 4, 8), (True, 2, 8)])
def test_drafts_longer_than_the_masks_left_commit_each_token_once(toy, gen_length, draft_size):
    """The ranking pads a draft longer than the masks by repeating a position: the padding must not overwrite the
    tokens committed there (it looped forever on one mask and over-counted accepted tokens)."""
    if toy:
        model = ToyDLM(length=4 + gen_length, strength=0.05, seed=0)
        ids = torch.randint(0, model.vocab - 1, (2, 4), generator=torch.Generator().manual_seed(0))
    else:
        model, ids = tiny_dlm(seed=0, std=0.6), torch.tensor([[1, 2, 3], [4, 5, 6]])
    ref = generate(model, ids, gen_length, gen_length, method="stepwise")
    out = generate(model, ids, gen_length, gen_length, method="ssd", draft_size=draft_size)
    assert torch.equal(out.sequences, ref.sequences)
    histogram = out.stats.accepted_histogram
    assert sum((i + 1) * count for i, count in enumerate(histogram)) == ids.shape[0] * gen_length
