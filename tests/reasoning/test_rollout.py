"""RolloutBatch bookkeeping and the TRL rollout_func contract."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from specmm.core.sampling import SamplingConfig
from specmm.reasoning import DraftOnly, RewardThreshold, StepSpeculator, TargetOnly
from tests.reasoning.helpers import ContentRouting, Forced, by_parity, judge, models, prompts, step_ids


@pytest.mark.parametrize("schedule", ["lockstep", "async"])
def test_stats_spans_and_to_trl_agree_with_the_tokens(schedule):
    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, ContentRouting(), delimiter=step_ids(tokenizer), max_step_tokens=6)
    out = spec.generate(prompts(3), max_new_tokens=20, sampling=SamplingConfig(1.0), seed=2, schedule=schedule,
                        batch_size=2, refill=schedule == "async")
    trl = out.to_trl()
    assert set(trl) >= {"prompt_ids", "completion_ids", "logprobs"}
    assert trl["completion_ids"] == out.completions
    assert [len(lp) for lp in trl["logprobs"]] == [len(c) for c in out.completions]
    assert trl["prompt_ids"] == [tokenizer.encode(p) for p in prompts(3)]
    mask = out.completion_mask.bool()
    stats, extras = out.stats, out.stats.reasoning
    assert stats.new_tokens_per_row == [len(c) for c in out.completions] and stats.new_tokens == int(mask.sum())
    assert extras.draft_tokens == int((out.source[mask] == 0).sum()) > 0
    assert stats.new_tokens - extras.draft_tokens == int((out.source[mask] == 1).sum()) > 0
    assert extras.steps == sum(len(s) for s in out.step_spans) == extras.draft_steps + extras.target_steps
    assert extras.checked_steps == extras.steps and extras.step_acceptance == out.acceptance_rate
    assert extras.discarded_draft_tokens > 0 and extras.judge_forwards == 0  # this policy routes without a judge
    assert stats.mean_accepted == stats.new_tokens / stats.row_forwards and stats.draft_forwards > 0
    assert stats.row_forwards == sum(stats.target_forwards_per_row) and stats.wall_time_s > 0
    assert (out.source[~mask] == -1).all() and (out.behaviour_logprobs[~mask] == 0).all()
    assert all(lp <= 0 for row in trl["logprobs"] for lp in row)
    assert set(out.phase_time_s) >= {"draft", "policy", "target"} and not out.exact
    assert all(0 < share < 1 for share in out.busy_share.values())
    assert len(out.latency_s) == 3 and all(0 < t <= stats.wall_time_s for t in out.latency_s)


def test_target_only_rollouts_are_flagged_exact():
    tokenizer, target, _draft = models()
    out = StepSpeculator(target, None, tokenizer, TargetOnly(), delimiter=step_ids(tokenizer)).generate(
        prompts(1), max_new_tokens=6)
    assert out.exact and out.decisions == [[None] * len(out.step_spans[0])]


def test_target_only_takes_one_target_forward_per_token_in_every_row():
    tokenizer, target, _draft = models()
    spec = StepSpeculator(target, None, tokenizer, TargetOnly(), delimiter=step_ids(tokenizer), max_step_tokens=5)
    eos = spec.generate(prompts(3), max_new_tokens=14, eos_token_id=[]).completions[0][3]  # row 0 stops early
    stats = spec.generate(prompts(3), max_new_tokens=14, eos_token_id=eos).stats
    assert stats.new_tokens_per_row[0] <= 4 and max(stats.new_tokens_per_row) > 4  # ragged rows
    assert stats.target_forwards_per_row == stats.new_tokens_per_row and stats.mean_accepted == 1.0
    assert stats.target_forwards == max(stats.new_tokens_per_row) and stats.draft_forwards == 0
    assert stats.reasoning.target_steps == stats.reasoning.steps and stats.reasoning.step_acceptance is None


def test_judged_steps_count_judge_forwards_as_target_forwards():
    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, Forced(judge(tokenizer), by_parity), delimiter=step_ids(tokenizer),
                          max_step_tokens=6)
    out = spec.generate(prompts(2), max_new_tokens=18)
    stats, extras = out.stats, out.stats.reasoning
    assert extras.judge_forwards == max(map(len, out.step_spans)) and extras.judge_tokens > 0  # one per step
    assert 0 < extras.draft_steps < extras.steps and extras.step_acceptance == out.acceptance_rate
    assert stats.mean_accepted == stats.new_tokens / stats.row_forwards
    assert all(f > 0 for f in stats.target_forwards_per_row)
    summary = stats.summary()
    assert summary["reasoning"]["judge_forwards"] == extras.judge_forwards
    assert summary["mean_accepted"] == stats.mean_accepted


def reward_model(vocab: int):
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
    torch.manual_seed(3)
    return LlamaForSequenceClassification(config).double().eval()


def test_reward_threshold_decides_on_the_scorers_own_output():
    tokenizer, target, draft = models()
    scorer = reward_model(len(tokenizer))
    def run(policy):
        return StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer),
                              max_step_tokens=6).generate(prompts(2), max_new_tokens=18)
    keep_all, keep_none = run(RewardThreshold(scorer, -math.inf)), run(RewardThreshold(scorer, math.inf))
    assert torch.equal(keep_all.completion_ids, run(DraftOnly()).completion_ids)
    assert torch.equal(keep_none.completion_ids, run(TargetOnly()).completion_ids)
    scores = [s for row in keep_all.scores for s in row]
    middle = sorted(scores)[len(scores) // 2]
    mixed = run(RewardThreshold(scorer, middle))
    for b, text in enumerate(prompts(2)):
        prompt = tokenizer.encode(text)
        for (start, end), score, kept in zip(mixed.step_spans[b], mixed.scores[b], mixed.decisions[b]):
            if kept:  # the kept step is the scored draft step: rescore it alone
                ids = torch.tensor([prompt + mixed.completions[b][:end]])
                assert math.isclose(scorer(input_ids=ids).logits[0, 0].item(), score, rel_tol=1e-6)
            assert kept == (score >= middle)
