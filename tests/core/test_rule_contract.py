"""The core's exact rule and a rule that refuses temperature 0 honour the common rule contract."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.core.acceptance import ExactRule
from specmm.drafters import ModelDrafter
from tests.conftest import left_padded_batch, tiny_model
from tests.core.rule_contract import AcceptanceRuleCommonTest


class TestExactRule(AcceptanceRuleCommonTest):
    def make_rule(self, **knobs):
        return ExactRule()


class SamplingOnlyRule(ExactRule):
    """An exact rule that declares it is not defined at temperature 0 (a stand-in for sampling-only rules)."""

    greedy = "refuse"
    greedy_hint = "Use acceptance='exact' for greedy decoding."


class TestSamplingOnlyRule(AcceptanceRuleCommonTest):
    def make_rule(self, **knobs):
        return SamplingOnlyRule()


def test_a_refusing_rule_fails_before_any_forward():
    target = tiny_model("llama")
    calls = []
    handle = target.register_forward_hook(lambda *a: calls.append(1))
    ids, mask = left_padded_batch([4, 6], seed=1)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(target), acceptance=SamplingOnlyRule())
    with pytest.raises(ValueError, match="temperature 0.*acceptance='exact'"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=4, sampling=specmm.SamplingConfig(temperature=0.0))
    handle.remove()
    assert calls == []
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=4, sampling=specmm.SamplingConfig(temperature=1.0),
                       generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape[1] <= ids.shape[1] + 4
