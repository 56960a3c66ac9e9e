"""Tiny random models on the ChainArith character vocabulary, and policies that force decisions."""

from __future__ import annotations

import functools
import random

import torch

from specmm.reasoning import JudgeTemplate, SpecReason, StepPolicy
from specmm.zoo.chainarith_task import JUDGE, STEP, make_tokenizer, sample_problem
from tests.conftest import tiny_model


@functools.cache
def models():
    """(tokenizer, target, draft): random float64 Llamas, sharpened so steps vary but stay plausible."""
    tokenizer = make_tokenizer()
    vocab = len(tokenizer)
    target = tiny_model("llama", seed=0, vocab=vocab, logit_scale=3.0)
    draft = tiny_model("llama", seed=1, vocab=vocab, num_hidden_layers=1, logit_scale=3.0)
    return tokenizer, target, draft


def prompts(count: int = 4, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [sample_problem(rng).prompt for _ in range(count)]


def step_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(STEP)]


def judge(tokenizer) -> JudgeTemplate:
    return JudgeTemplate.from_text(tokenizer, JUDGE)


class Forced(SpecReason):
    """Runs the real judge round, then keeps draft steps by a rule of (row content, step index)."""

    def __init__(self, template, rule):
        super().__init__(0, template=template)
        self.rule, self.name = rule, "forced"

    def decide(self, view):
        scores, _ = super().decide(view)
        keep = torch.tensor([self.rule(ctx, step) for ctx, step in zip(view.contexts(), view.steps())],
                            dtype=torch.bool, device=scores.device)
        return scores, keep


class ContentRouting(StepPolicy):
    """No target round: keeps the draft step iff the sum of its ids is even (deterministic per row)."""

    name = "content"

    def decide(self, view):
        keep = torch.tensor([sum(s) % 2 == 0 for s in view.steps()], dtype=torch.bool)
        return torch.full((len(keep),), float("nan")), keep


def by_parity(context, step) -> bool:
    return (sum(step) + len(context)) % 2 == 0
