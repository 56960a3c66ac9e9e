"""Token-level speculation inside regenerated steps is exact: greedy tokens equal target-only, sampled
tokens follow the target's distribution (chi-square), batched equals row by row, and both caches stay
exact (behaviour log-probs equal teacher-forced ones; the target as its own draft accepts every draft)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specmm.core.sampling import SamplingConfig, process_logits
from specmm.reasoning import DRAFT, TARGET, StepSpeculator, TargetOnly
from tests.reasoning.test_behaviour_logprobs import teacher_forced
from tests.reasoning.helpers import (
    ContentRouting,
    Forced,
    judge,
    models,
    prompts,
    step_ids,
)


def spec_for(policy, k):
    tokenizer, target, draft = models()
    return StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=7,
                          inner_speculation=k)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_inner_speculation_equals_target_only(k):
    tokenizer = models()[0]
    reference = spec_for(TargetOnly(), None).generate(prompts(), max_new_tokens=30)
    for policy in (TargetOnly(), Forced(judge(tokenizer), lambda c, s: False)):
        out = spec_for(policy, k).generate(prompts(), max_new_tokens=30)
        assert out.completions == reference.completions and out.step_spans == reference.step_spans
        assert torch.equal(out.behaviour_logprobs, reference.behaviour_logprobs)
        assert out.stats.mean_accepted == out.stats.new_tokens / out.stats.row_forwards
    tokenizer, target, _ = models()
    itself = StepSpeculator(target, target, tokenizer, TargetOnly(), delimiter=step_ids(tokenizer), max_step_tokens=7,
                            inner_speculation=k).generate(prompts(), max_new_tokens=30)  # every draft is accepted
    inner = itself.stats
    assert itself.completions == reference.completions and reference.stats.mean_accepted == 1.0
    assert inner.new_tokens_per_row == reference.stats.new_tokens_per_row
    assert all(f < n for f, n in zip(inner.target_forwards_per_row, inner.new_tokens_per_row))
    assert inner.mean_accepted == inner.new_tokens / inner.row_forwards > 1.5


def test_inner_speculation_mixed_with_kept_draft_steps_is_batched_like_row_by_row():
    sampling = SamplingConfig(0.9)
    batch = prompts(4, seed=2)
    together = spec_for(ContentRouting(), 2).generate(batch, max_new_tokens=30, sampling=sampling, seed=5)
    for b, text in enumerate(batch):
        alone = spec_for(ContentRouting(), 2).generate([text], max_new_tokens=30, sampling=sampling, seed=5 + b)
        assert together.completions[b] == alone.completions[0]


def test_sampled_inner_speculation_follows_the_target_distribution():
    tokenizer, target, _ = models()
    prompt = tokenizer.encode(prompts(1)[0])
    sampling = SamplingConfig(1.0)
    rows = 3000
    out = spec_for(TargetOnly(), 2).generate([prompt] * rows, max_new_tokens=2, sampling=sampling, seed=0,
                                             eos_token_id=[])
    pairs = torch.tensor([c[:2] for c in out.completions])  # [N, 2]
    vocab = len(tokenizer)
    with torch.no_grad():  # exact joint law of the first two tokens under the target
        first = process_logits(target(input_ids=torch.tensor([prompt])).logits[0, -1], sampling).double()
        contexts = torch.tensor([prompt + [t] for t in range(vocab)])
        second = process_logits(target(input_ids=contexts).logits[:, -1], sampling).double()
    joint = (first[:, None] * second).flatten()  # [V * V]
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    big = joint * rows >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([joint[big], joint[~big].sum()[None]])
    expected = expected / expected.sum() * rows  # float32 softmax sums differ from 1 by ~1e-7
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("k", [1, 3])
def test_the_target_as_its_own_draft_accepts_every_draft(k):
    """A draft cache out of step with the context would reject drafts: every round must yield k + 1 tokens."""
    tokenizer, target, _ = models()
    spec = StepSpeculator(target, target, tokenizer, TargetOnly(), delimiter=step_ids(tokenizer),
                          max_step_tokens=7, inner_speculation=k)
    out = spec.generate(prompts(), max_new_tokens=30)
    steps = max(len(spans) for spans in out.step_spans)
    rounds = [max(-(-(end - start) // (k + 1)) for spans in out.step_spans if s < len(spans)
                  for start, end in [spans[s]]) for s in range(steps)]  # the slowest row of each step
    assert out.stats.target_forwards == sum(rounds)  # the rounds (the prompt's prefill makes no token)


@pytest.mark.parametrize("k", [1, 4])
def test_caches_stay_exact_across_kept_draft_steps_and_speculated_steps(k):
    tokenizer, target, draft = models()
    sampling = SamplingConfig(0.8, top_k=10)
    spec = StepSpeculator(target, draft, tokenizer, ContentRouting(), delimiter=step_ids(tokenizer),
                          max_step_tokens=6, inner_speculation=k)
    batch = prompts(4, seed=5)
    out = spec.generate(batch, max_new_tokens=30, sampling=sampling, seed=3)
    decisions = [d for row in out.decisions for d in row]
    assert 0 < sum(decisions) < len(decisions)
    for b, text in enumerate(batch):
        completion = out.completions[b]
        source = out.source[b, : len(completion)]
        expected = torch.zeros(len(completion))
        for value, model in ((DRAFT, draft), (TARGET, target)):
            recomputed = teacher_forced(model, tokenizer.encode(text), completion, sampling).float()
            expected = torch.where(source == value, recomputed, expected)
        torch.testing.assert_close(out.behaviour_logprobs[b, : len(completion)], expected, atol=1e-5, rtol=1e-5)
