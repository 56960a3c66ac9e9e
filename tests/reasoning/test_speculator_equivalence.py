"""Lossless reductions: always-reject == target-only, always-accept == draft-only, bit for bit; batched ==
row by row; target-only greedy == HF generate."""

from __future__ import annotations

import pytest
import torch

from specmm.core.sampling import SamplingConfig
from specmm.reasoning import (
    DraftOnly,
    RandomRouting,
    SpecReason,
    StepSpeculator,
    TargetOnly,
)
from tests.reasoning.helpers import (
    ContentRouting,
    Forced,
    by_parity,
    judge,
    models,
    prompts,
    step_ids,
)

SAMPLINGS = {"greedy": (SamplingConfig(0.0), None), "sampled": (SamplingConfig(0.9, top_k=12), 7)}
MAX_NEW, STEP_BUDGET = 36, 7


def run(policy, sampling_name, batch=None, **kw):
    tokenizer, target, draft = models()
    sampling, seed = SAMPLINGS[sampling_name]
    seed = kw.pop("seed", seed)
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=STEP_BUDGET)
    return spec.generate(batch or prompts(), max_new_tokens=MAX_NEW, sampling=sampling, seed=seed, **kw)


def assert_same(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.behaviour_logprobs, b.behaviour_logprobs)
    assert a.step_spans == b.step_spans


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_always_reject_equals_target_only_bit_for_bit(sampling):
    tokenizer = models()[0]
    reference = run(TargetOnly(), sampling)
    for policy in (Forced(judge(tokenizer), lambda c, s: False), RandomRouting(1.0)):
        out = run(policy, sampling)
        assert_same(out, reference)
        assert (out.source[out.completion_mask.bool()] == 1).all() and out.acceptance_rate == 0.0


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_always_accept_equals_draft_only_bit_for_bit(sampling):
    reference = run(DraftOnly(), sampling)
    for policy in (SpecReason(0, template=judge(models()[0])), RandomRouting(0.0)):
        out = run(policy, sampling)
        assert_same(out, reference)
        assert (out.source[out.completion_mask.bool()] == 0).all() and out.acceptance_rate == 1.0


def test_target_only_greedy_equals_hf_generate():
    tokenizer, target, _ = models()
    out = run(TargetOnly(), "greedy", eos_token_id=[])
    for b, text in enumerate(prompts()):
        ids = torch.tensor([tokenizer.encode(text)])
        reference = target.generate(ids, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
        assert out.completions[b] == reference[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("policy_name", ["judged", "content"])
def test_batched_equals_row_by_row(sampling, policy_name):
    tokenizer = models()[0]
    policy = Forced(judge(tokenizer), by_parity) if policy_name == "judged" else ContentRouting()
    batch = prompts(4, seed=3)
    together = run(policy, sampling, batch=batch)
    decisions = [d for row in together.decisions for d in row]
    assert 0 < sum(decisions) < len(decisions)  # a real mixture of draft and target steps
    _, seed = SAMPLINGS[sampling]
    for b, text in enumerate(batch):
        alone = run(policy, sampling, batch=[text], seed=None if seed is None else seed + b)
        assert together.completions[b] == alone.completions[0]
        assert together.step_spans[b] == alone.step_spans[0]
        assert together.decisions[b] == alone.decisions[0]
        n = len(alone.completions[0])
        torch.testing.assert_close(together.behaviour_logprobs[b, :n], alone.behaviour_logprobs[0, :n])
