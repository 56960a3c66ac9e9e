"""Near-ties: a row that parts from plain decoding where the target's two best logits are within the rounding of
its precision is a tie, anywhere else a mismatch."""

from __future__ import annotations

import pytest
import torch

from specmm.bench.harness import Method, RunResult, run_benchmark
from specmm.bench.report import BenchReport
from specmm.bench.ties import count_ties, first_difference, logit_tie_judge, processed_next_scores
from tests.conftest import tiny_model


@pytest.mark.parametrize("reference, tokens, index", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 5, 3], 1),
    ([1, 2, 3], [4, 2, 3], 0),
    ([1, 2], [1, 2, 3], None),  # a prefix: no token of its own to compare
])
def test_first_difference_table(reference, tokens, index):
    assert first_difference(reference, tokens) == index


def test_count_ties_asks_the_judge_only_about_differing_rows():
    asked = []

    def judge(row, reference, tokens):
        asked.append(row)
        return row == 1

    reference = [[1, 2], [3, 4], [5, 6], [7, 8]]
    rows = [[1, 2], [3, 9], [5, 0], [7, 8]]
    assert count_ties(reference, rows, judge) == (2, 1) and asked == [1, 2]
    assert count_ties(reference, rows[:3], judge) == (3, 1)  # a missing row differs and is no tie


def _target_and_prompt():
    model = tiny_model("llama", dtype=torch.float32).eval()
    prompt = torch.tensor([[0, 0, 5, 9, 13]])  # left padded
    mask = (prompt != 0).long()
    with torch.no_grad():
        logits = model(input_ids=prompt[:, 2:]).logits[0, -1]
    best, second = logits.topk(2).indices.tolist()
    worst = logits.argmin().item()
    return model, prompt, mask, best, second, worst, (logits[best] - logits[second]).item()


def test_the_logit_judge_calls_a_gap_within_the_allowed_rounding_a_tie():
    model, prompt, mask, best, second, worst, gap = _target_and_prompt()
    scale = 2 * gap  # an allowed gap (relative to the largest logit, at least 1) just over the real one
    lenient = logit_tie_judge(model, prompt, mask, relative_gap=scale)
    strict = logit_tie_judge(model, prompt, mask, relative_gap=gap / 100)
    assert lenient(0, [best, 1], [second, 7]) and not strict(0, [best, 1], [second, 7])
    assert not lenient(0, [best], [worst])  # far apart: a real mismatch
    assert not lenient(0, [best], [best, 4])  # no differing token


def test_a_bench_row_that_differs_only_at_near_ties_reads_ties():
    rows, _ = run_benchmark([Method("base", lambda: RunResult([[1, 2], [3, 4]])),
                             Method("tied", lambda: RunResult([[1, 5], [3, 4]])),
                             Method("off", lambda: RunResult([[1, 5], [6, 4]]))],
                            torch.device("cpu"), repeats=1, warmup=0, progress=False,
                            ties=lambda row, reference, tokens: row == 0)
    assert [(r.matched, r.differing_rows, r.near_tie_rows, r.match_cell) for r in rows] == [
        (True, 0, 0, "yes"), (False, 1, 1, "ties (1)"), (False, 2, 1, "NO")]
    report = BenchReport(name="t", command="c", rows=rows, setup={})
    assert "| ties (1) |" in report.table() and "near-tie of the target" in report.legend()


def test_under_a_repetition_penalty_the_judge_reads_the_processed_scores():
    """Raw logits of two tokens within the allowed gap, one of them in the prompt: the penalty moves that one, and
    HF chose between the processed scores, so the judge reads those (HF's own) and calls it a mismatch."""
    model = tiny_model("llama", dtype=torch.float32).eval()
    prompt = torch.tensor([[5, 9, 13]])
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0, -1]
    seen = 9  # a prompt token, and the token whose raw logit is nearest to it
    distance = (logits - logits[seen]).abs()
    distance[prompt[0]] = torch.inf
    near = int(distance.argmin())
    allowed = 1.5 * distance[near].item() / max(1.0, logits.abs().max().item())
    assert logit_tie_judge(model, prompt, mask, relative_gap=allowed)(0, [seen], [near])  # raw: a tie
    model.generation_config.repetition_penalty = 50.0
    scores = processed_next_scores(model, prompt, 0)
    expected = logits.clone()
    expected[prompt[0]] = torch.where(logits[prompt[0]] < 0, logits[prompt[0]] * 50.0, logits[prompt[0]] / 50.0)
    assert torch.allclose(scores, expected, atol=1e-5)  # HF's processed scores
    assert not logit_tie_judge(model, prompt, mask, relative_gap=allowed)(0, [seen], [near])
