"""Step-level speculation for reasoning models (SpecReason, Arbitrage, RSD-style) and RL rollout records."""

from specmm.reasoning.judge import JudgeTemplate
from specmm.reasoning.policies import (
    Arbitrage,
    DraftOnly,
    OracleRouting,
    RandomRouting,
    RewardThreshold,
    SpecReason,
    StepPolicy,
    TargetOnly,
)
from specmm.reasoning.rollout import DRAFT, TARGET, RolloutBatch
from specmm.reasoning.router import StepRouter, train_router
from specmm.reasoning.speculator import StepSpeculator
from specmm.reasoning.steps import StepDelimiter

__all__ = [
    "DRAFT",
    "TARGET",
    "Arbitrage",
    "DraftOnly",
    "JudgeTemplate",
    "OracleRouting",
    "RandomRouting",
    "RewardThreshold",
    "RolloutBatch",
    "SpecReason",
    "StepDelimiter",
    "StepPolicy",
    "StepRouter",
    "StepSpeculator",
    "TargetOnly",
    "train_router",
]
