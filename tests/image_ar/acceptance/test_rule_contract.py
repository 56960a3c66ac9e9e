"""Every image acceptance rule honours the common rule contract (tests/core/rule_contract.py)."""

from __future__ import annotations

import torch

from specmm.image_ar import GSD, SJD, Exact, Lantern, LanternPP
from tests.core.rule_contract import VOCAB, AcceptanceRuleCommonTest

CODEBOOK = torch.randn(VOCAB, 4, generator=torch.Generator().manual_seed(3))


class TestExact(AcceptanceRuleCommonTest):
    def make_rule(self, **knobs):
        return Exact()


class TestSJD(AcceptanceRuleCommonTest):
    def make_rule(self, **knobs):
        return SJD()


class TestLantern(AcceptanceRuleCommonTest):
    zero_knobs, relaxed_knobs = {"delta": 0.0}, {"delta": 0.3}
    reports_moved_mass_as_tv = True

    def make_rule(self, **knobs):
        return Lantern(k=4, **knobs).bind(CODEBOOK)


class TestLanternPP(AcceptanceRuleCommonTest):
    zero_knobs, relaxed_knobs = {"lam": 1.0}, {"lam": 3.0}
    reports_moved_mass_as_tv = True

    def make_rule(self, **knobs):
        return LanternPP(k=4, **knobs).bind(CODEBOOK)


class TestGSD(AcceptanceRuleCommonTest):
    zero_knobs, relaxed_knobs = {"window": 1}, {"window": 5, "p_gap": 0.3}

    def make_rule(self, **knobs):
        return GSD(**knobs).bind(CODEBOOK, quantile=0.5)
