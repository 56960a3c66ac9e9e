"""RL contract: behaviour log-probs equal a teacher-forced recomputation under each token's source model."""

from __future__ import annotations

import pytest
import torch

from specmm.core.sampling import SamplingConfig, process_logits
from specmm.reasoning import DRAFT, TARGET, StepSpeculator
from tests.reasoning.helpers import (
    ContentRouting,
    Forced,
    by_parity,
    judge,
    models,
    prompts,
    step_ids,
)


def teacher_forced(model, prompt: list[int], completion: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """[n] log-prob of each completion token under `model`'s processed distribution, no cache."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1]  # [n, V]
    probs = process_logits(logits, sampling)
    return probs.gather(1, torch.tensor(completion)[:, None])[:, 0].clamp_min(1e-45).log()


@pytest.mark.parametrize("policy_name", ["judged", "content"])
def test_behaviour_logprobs_equal_teacher_forced_source_model(policy_name):
    tokenizer, target, draft = models()
    policy = Forced(judge(tokenizer), by_parity) if policy_name == "judged" else ContentRouting()
    sampling = SamplingConfig(0.8, top_k=10, top_p=0.95)
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=6)
    batch = prompts(3, seed=5)
    out = spec.generate(batch, max_new_tokens=24, sampling=sampling, seed=11)
    sources = {DRAFT: draft, TARGET: target}
    seen = set()
    for b, text in enumerate(batch):
        completion = out.completions[b]
        source = out.source[b, : len(completion)]
        for step, (start, end) in enumerate(out.step_spans[b]):
            assert (source[start:end] == (DRAFT if out.decisions[b][step] else TARGET)).all()
        expected = torch.zeros(len(completion))
        for value, model in sources.items():
            recomputed = teacher_forced(model, tokenizer.encode(text), completion, sampling)
            expected = torch.where(source == value, recomputed.float(), expected)
            seen.add(value) if (source == value).any() else None
        torch.testing.assert_close(out.behaviour_logprobs[b, : len(completion)], expected, atol=1e-5, rtol=1e-5)
    assert seen == {DRAFT, TARGET}
    assert not out.exact


def test_greedy_behaviour_logprobs_are_zero_point_mass():
    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, ContentRouting(), delimiter=step_ids(tokenizer), max_step_tokens=6)
    out = spec.generate(prompts(2), max_new_tokens=12)
    assert torch.equal(out.behaviour_logprobs, torch.zeros_like(out.behaviour_logprobs))
