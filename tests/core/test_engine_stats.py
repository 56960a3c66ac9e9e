"""`GenerationStats` is honest: mean_accepted is tokens per target forward, bonus included."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.drafters import ModelDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model


@pytest.mark.parametrize("k", [1, 3, 5])
def test_mean_accepted_is_k_plus_one_when_the_draft_is_the_target(k):
    target = tiny_model("llama")
    ids, _ = left_padded_batch([6], seed=2)
    rounds = 4
    out = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=specmm.TreeSpec.chain(k)).generate(
        ids, max_new_tokens=rounds * (k + 1))
    stats = out.stats
    assert stats.mean_accepted == k + 1
    assert stats.mean_accepted == stats.new_tokens / stats.target_forwards
    assert stats.target_forwards == rounds and stats.new_tokens == rounds * (k + 1)
    assert stats.draft_forwards == 1 + rounds * k  # prompt prefill, then one forward per drafted token
    assert stats.accepted_histogram == [0] * k + [rounds]


def test_stats_add_up_over_a_ragged_batch_with_eos():
    target = tiny_model("qwen2")
    ids, mask = left_padded_batch([3, 8, 5], seed=4)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    eos = int(free[0, ids.shape[1] + 4])  # row 0 stops after 5 tokens
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=specmm.TreeSpec.chain(3))
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=19, eos_token_id=eos, pad_token_id=0)
    stats = out.stats
    new = out.sequences[:, ids.shape[1]:]
    assert new.shape[1] <= 19
    assert stats.new_tokens_per_row[0] == (new[0] == eos).nonzero()[0].item() + 1
    assert stats.new_tokens == sum(stats.new_tokens_per_row)
    assert sum(stats.accepted_histogram) == sum(stats.target_forwards_per_row)
    assert stats.target_forwards == max(stats.target_forwards_per_row)
    assert stats.mean_accepted == pytest.approx(stats.new_tokens / sum(stats.target_forwards_per_row))
    for n, f, m in zip(stats.new_tokens_per_row, stats.target_forwards_per_row, stats.mean_accepted_per_row):
        assert m == pytest.approx(n / f)
    assert stats.wall_time_s > 0 and stats.tokens_per_second > 0


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_max_new_tokens_is_never_exceeded(max_new):
    target = tiny_model("llama")
    ids, mask = left_padded_batch([4, 6], seed=1)
    out = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=specmm.TreeSpec.chain(4)).generate(
        ids, attention_mask=mask, max_new_tokens=max_new)
    assert out.sequences.shape[1] == ids.shape[1] + max_new
    assert out.stats.new_tokens_per_row == [max_new, max_new]
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new, pad_token_id=0)
    assert torch.equal(out.sequences, reference)
