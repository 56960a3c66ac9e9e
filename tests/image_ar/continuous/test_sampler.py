"""CSpD mechanics: a draft equal to the target accepts everything, ragged rows, fallback, bad input."""

from __future__ import annotations

import pytest
import torch

from specmm.image_ar.continuous import CSpDSampler, sample_ar
from tests.conftest import perturbed_copy
from tests.image_ar.continuous.conftest import tiny_model


@pytest.mark.parametrize("rule", ["trajectory", "final-step"])
def test_draft_equal_to_target_accepts_every_draft(rule):
    target = tiny_model(head="ddpm", diffusion_steps=3, grid=3, dtype=torch.float64)
    out = CSpDSampler(target, target, draft_tokens=4, rule=rule).sample(torch.arange(6) % 3,
                                                                        generator=torch.Generator().manual_seed(0))
    assert out.stats.continuous.acceptance_rate == 1.0 and out.stats.continuous.residual_proposals == 0
    assert out.stats.target_forwards == 2 and out.stats.mean_accepted == pytest.approx(9 / 2)  # 5 + 4 tokens


def test_rows_accept_different_lengths_and_every_token_is_filled():
    target = tiny_model(grid=3)
    draft = perturbed_copy(target, 0.5, seed=5)
    labels = torch.arange(32) % 3
    out = CSpDSampler(target, draft, draft_tokens=3, prefill_tokens=2).sample(
        labels, generator=torch.Generator().manual_seed(1))
    assert out.tokens.shape == (32, 9, 2) and (out.tokens.abs().sum(-1) > 0).all()
    assert out.stats.new_tokens == 32 * 9 and 0 < out.stats.continuous.acceptance_rate < 1
    assert 1 < out.stats.mean_accepted < 4 and out.stats.row_forwards > 32 * 2  # ragged rows: not all in lockstep


def test_stats_count_per_row_forwards_accepted_drafts_and_prefill():
    target = tiny_model(grid=3)
    draft = perturbed_copy(target, 0.5, seed=5)
    k, prefill, rows = 3, 2, 16
    stats = CSpDSampler(target, draft, draft_tokens=k, prefill_tokens=prefill).sample(
        torch.arange(rows) % 3, generator=torch.Generator().manual_seed(1)).stats
    assert stats.new_tokens_per_row == [9] * rows and stats.new_tokens == 9 * rows
    assert len(stats.target_forwards_per_row) == rows and len(set(stats.target_forwards_per_row)) > 1  # ragged
    assert stats.row_forwards == sum(stats.target_forwards_per_row)
    assert stats.mean_accepted == pytest.approx(stats.new_tokens / stats.row_forwards)
    assert max(stats.target_forwards_per_row) == stats.target_forwards  # a round runs while any row is unfinished
    assert len(stats.accepted_histogram) == k + 1 and sum(stats.accepted_histogram) == stats.row_forwards
    assert stats.accepted_histogram[0] >= prefill * rows  # prefill steps accept no draft
    extras = stats.continuous
    assert stats.accepted_drafts == extras.accepted > 0 and extras.accepted < extras.drafted
    assert extras.residual_proposals > 0 and stats.draft_forwards > 0
    assert stats.summary()["continuous"]["acceptance_rate"] == extras.acceptance_rate


def test_plain_ar_stats_are_one_token_per_row_forward():
    stats = sample_ar(tiny_model(grid=3), torch.arange(4) % 3).stats
    assert stats.target_forwards == 9 and stats.target_forwards_per_row == [9] * 4
    assert stats.new_tokens_per_row == [9] * 4 and stats.mean_accepted == 1.0
    assert stats.accepted_histogram == [36] and stats.continuous.drafted == 0


def test_exhausted_residual_sampler_falls_back_to_a_target_sample_not_a_zero_token():
    target = tiny_model()
    draft = tiny_model(seed=9)  # unrelated: rejections are common
    out = CSpDSampler(target, draft, draft_tokens=2, max_proposals=1, proposals_per_round=1).sample(
        torch.arange(64) % 3, generator=torch.Generator().manual_seed(2))
    assert out.stats.continuous.fallbacks > 0
    assert (out.tokens.abs().sum(-1) > 0).all() and torch.isfinite(out.tokens).all()


def test_same_seed_gives_the_same_images():
    target, draft = tiny_model(), perturbed_copy(tiny_model(), 0.3, seed=5)
    sampler = CSpDSampler(target, draft, draft_tokens=2)
    first = sampler.sample(torch.arange(4) % 3, generator=torch.Generator().manual_seed(3)).tokens
    second = sampler.sample(torch.arange(4) % 3, generator=torch.Generator().manual_seed(3)).tokens
    assert torch.equal(first, second) and not torch.equal(first, sampler.sample(torch.arange(4) % 3).tokens)


@pytest.mark.parametrize(("kwargs", "name"), [({"draft_tokens": 0}, "draft_tokens"),
                                              ({"prefill_tokens": 5}, "prefill_tokens"),
                                              ({"rule": "greedy"}, "rule"), ({"max_proposals": 0}, "max_proposals"),
                                              ({"proposals_per_round": 0}, "proposals_per_round")])
def test_bad_sampler_arguments_are_value_errors(kwargs, name):
    target = tiny_model()
    with pytest.raises(ValueError, match=name):
        CSpDSampler(target, target, **kwargs)


@pytest.mark.parametrize("field", ["token_dim", "grid", "diffusion_steps", "order"])
def test_a_draft_of_another_family_is_rejected(field):
    value = {"token_dim": 3, "grid": 3, "diffusion_steps": 2, "order": "random"}[field]
    with pytest.raises(ValueError, match=f"draft: its {field}"):
        CSpDSampler(tiny_model(head="ddpm", diffusion_steps=1),
                    tiny_model(head="ddpm", **{"diffusion_steps": 1, field: value}))


@pytest.mark.parametrize(("labels", "temperature", "name"), [(torch.tensor([0, 3]), 1.0, "labels"),
                                                              (torch.tensor([[0]]), 1.0, "labels"),
                                                              (torch.tensor([0.5]), 1.0, "labels"),
                                                              (torch.tensor([0]), 0.0, "temperature")])
def test_bad_labels_and_temperature_are_value_errors(labels, temperature, name):
    target = tiny_model()
    with pytest.raises(ValueError, match=name):
        CSpDSampler(target, target).sample(labels, temperature=temperature)
    with pytest.raises(ValueError, match=name):
        sample_ar(target, labels, temperature=temperature)
