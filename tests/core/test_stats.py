"""`GenerationStats.add` sums a job's batches without changing what `mean_accepted` means; `summary` is flat JSON."""

from __future__ import annotations

import json

import pytest

from specmm import GenerationStats as TopLevel
from specmm.core.engine import GenerationStats as FromEngine
from specmm.core.stats import CaptionExtras, ContinuousExtras, GenerationStats, ReasoningExtras


def _batch(tokens: list[int], forwards: list[int], histogram: list[int], **kw) -> GenerationStats:
    return GenerationStats(target_forwards=max(forwards), draft_forwards=2 * max(forwards), new_tokens=sum(tokens),
                           wall_time_s=0.5, new_tokens_per_row=tokens, target_forwards_per_row=forwards,
                           accepted_histogram=histogram, **kw)


def test_one_class_whatever_the_import_path():
    assert TopLevel is FromEngine is GenerationStats


def test_add_appends_rows_sums_counters_and_pads_histograms():
    first = _batch([6, 2], [2, 2], [1, 1, 2], moved_mass=0.25, continuous=ContinuousExtras(4, 3, 7, 1))
    second = _batch([3], [3], [3], continuous=ContinuousExtras(2, 0, 5, 0), reasoning=ReasoningExtras(steps=2))
    total = GenerationStats().add(first).add(second)
    assert total.new_tokens_per_row == [6, 2, 3] and total.target_forwards_per_row == [2, 2, 3]
    assert (total.target_forwards, total.draft_forwards, total.new_tokens) == (5, 10, 11)
    assert total.wall_time_s == 1.0 and total.moved_mass == 0.25
    assert total.accepted_histogram == [4, 1, 2] and total.accepted_drafts == 5
    assert total.continuous == ContinuousExtras(6, 3, 12, 1) and total.continuous.acceptance_rate == 0.5
    assert total.reasoning == ReasoningExtras(steps=2)  # created on first sight
    assert total.caption is None and total.diffusion is None
    # mean_accepted of the sum is tokens over row forwards of all rows, not a mean of the batches' means
    assert total.row_forwards == 7 and total.mean_accepted == 11 / 7
    assert total.mean_accepted != (first.mean_accepted + second.mean_accepted) / 2
    assert first.new_tokens_per_row == [6, 2]  # the added batches are left as they were
    assert second.continuous == ContinuousExtras(2, 0, 5, 0)


def test_summary_is_flat_json_with_derived_figures_and_only_the_extras_present():
    stats = _batch([4, 2], [2, 2], [2, 1, 1], moved_mass=0.5, caption=CaptionExtras(captioned=2, errors=1),
                   reasoning=ReasoningExtras(steps=3, draft_steps=1, target_steps=2, checked_steps=2))
    out = json.loads(json.dumps(stats.summary()))
    assert out["row_forwards"] == 4 and out["mean_accepted"] == 1.5 and out["new_tokens"] == 6
    assert out["accepted_histogram"] == [2, 1, 1] and out["moved_mass_per_accepted_draft"] == pytest.approx(0.5 / 3)
    assert out["caption"] == {"captioned": 2, "skipped": 0, "errors": 1}
    assert out["reasoning"]["step_acceptance"] == 0.5 and out["reasoning"]["steps"] == 3
    assert not {"image", "continuous", "diffusion"} & set(out)
    assert GenerationStats().summary()["mean_accepted"] == 0.0  # no forwards: no division by zero
