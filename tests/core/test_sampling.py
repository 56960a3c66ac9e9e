"""Processed distributions: one order, float32, the filters keep exactly what they promise."""

from __future__ import annotations

import torch

from specmm.core.sampling import SamplingConfig, process_logits, sample, uniform


def test_greedy_is_a_point_mass_on_the_argmax():
    logits = torch.randn(4, 10, dtype=torch.float64)
    probs = process_logits(logits, SamplingConfig(temperature=0.0))
    assert probs.dtype == torch.float32
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.equal(probs.sum(-1), torch.ones(4))
    assert int((probs > 0).sum()) == 4


def test_top_k_keeps_exactly_k_tokens_and_top_p_the_smallest_sufficient_set():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert int((process_logits(logits, SamplingConfig(1.0, top_k=2)) > 0).sum()) == 2
    full = logits.softmax(-1)[0]  # [0.636, 0.234, 0.086, 0.032, 0.012]
    kept = process_logits(logits, SamplingConfig(1.0, top_p=0.85))[0]
    assert (kept > 0).tolist() == [True, True, False, False, False]  # 0.636 + 0.234 >= 0.85
    torch.testing.assert_close(kept[:2], full[:2] / full[:2].sum())
    assert int((process_logits(logits, SamplingConfig(1.0, top_p=0.5)) > 0).sum()) == 1


def test_order_is_guidance_then_temperature_then_top_k_then_top_p():
    seen = []

    def guidance(x):
        seen.append(x.clone())
        return x * 2

    logits = torch.tensor([[1.0, 0.5, 0.0, -1.0]])
    probs = process_logits(logits, SamplingConfig(temperature=0.5, top_k=3, top_p=0.99), guidance=guidance)
    assert torch.equal(seen[0], logits)  # guidance sees raw logits
    expected = (logits * 2 / 0.5)[:, :3].softmax(-1)  # temperature, then top-3
    expected = expected * (expected.cumsum(-1) - expected < 0.99)
    torch.testing.assert_close(probs[:, :3], expected / expected.sum())
    assert probs[0, 3] == 0


def test_per_row_generators_make_rows_independent_and_reproducible():
    a = uniform(3, (5,), [torch.Generator().manual_seed(s) for s in (1, 2, 3)], torch.device("cpu"))
    b = uniform(3, (5,), [torch.Generator().manual_seed(s) for s in (3, 2, 1)], torch.device("cpu"))
    assert torch.equal(a[0], b[2]) and torch.equal(a[1], b[1])
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    draws = torch.stack([sample(probs, torch.Generator().manual_seed(s)) for s in range(200)])
    assert (draws[:, 0] == 1).all() and set(draws[:, 1].tolist()) == {0, 2}
