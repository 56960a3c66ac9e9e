"""RolloutBatch bookkeeping and the TRL rollout_func contract."""

from __future__ import annotations

import math

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from specmm.core.sampling import SamplingConfig
from specmm.reasoning import DraftOnly, RewardThreshold, StepSpeculator, TargetOnly
from tests.reasoning.helpers import ContentRouting, models, prompts, step_ids


def test_counters_spans_and_to_trl_agree_with_the_tokens():
    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, ContentRouting(), delimiter=step_ids(tokenizer), max_step_tokens=6)
    out = spec.generate(prompts(3), max_new_tokens=20, sampling=SamplingConfig(1.0), seed=2)
    trl = out.to_trl()
    assert set(trl) >= {"prompt_ids", "completion_ids", "logprobs"}
    assert trl["completion_ids"] == out.completions
    assert [len(lp) for lp in trl["logprobs"]] == [len(c) for c in out.completions]
    assert trl["prompt_ids"] == [tokenizer.encode(p) for p in prompts(3)]
    mask = out.completion_mask.bool()
    assert out.counters["draft_tokens_kept"] == int((out.source[mask] == 0).sum())
    assert out.counters["target_tokens"] == int((out.source[mask] == 1).sum())
    assert out.counters["steps"] == sum(len(s) for s in out.step_spans)
    assert (out.source[~mask] == -1).all() and (out.behaviour_logprobs[~mask] == 0).all()
    assert all(lp <= 0 for row in trl["logprobs"] for lp in row)
    assert set(out.phase_time_s) >= {"draft", "verify", "target", "sync"} and not out.exact


def test_target_only_rollouts_are_flagged_exact():
    tokenizer, target, _draft = models()
    out = StepSpeculator(target, None, tokenizer, TargetOnly(), delimiter=step_ids(tokenizer)).generate(
        prompts(1), max_new_tokens=6)
    assert out.exact and out.decisions == [[None] * len(out.step_spans[0])]


def reward_model(vocab: int):
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
    torch.manual_seed(3)
    return LlamaForSequenceClassification(config).double().eval()


def test_reward_threshold_decides_on_the_scorers_own_output():
    tokenizer, target, draft = models()
    scorer = reward_model(len(tokenizer))
    run = lambda policy: StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer),
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
