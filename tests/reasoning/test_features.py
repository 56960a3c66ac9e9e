"""Router features line up with the draft step even when every row ends before the step budget."""

from __future__ import annotations

import torch

from specmm.reasoning import Arbitrage, StepSpeculator
from specmm.reasoning.router import STAT_FEATURES, RouterConfig, StepRouter
from tests.reasoning.helpers import models, prompts


class Recording(Arbitrage):
    def __init__(self, router):
        super().__init__(router, 0.5)
        self.widths = []

    def decide(self, view):
        self.widths.append((view.draw.hidden.shape[1], view.draw.tokens.shape[1], int(view.draw.lengths.max())))
        return super().decide(view)


def test_hidden_states_cover_exactly_the_step_tokens_when_steps_end_early():
    tokenizer, target, draft = models()
    policy = Recording(StepRouter(RouterConfig(hidden_size=draft.config.hidden_size)).double())
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]  # frequent: steps end early
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=digits, max_step_tokens=40)
    for text in prompts(3):  # one row at a time, so a step ends when that row ends it
        spec.generate([text], max_new_tokens=200)
    assert sum(longest < 20 for _, _, longest in policy.widths) > 3  # steps that end well before the budget
    assert all(h == t == longest for h, t, longest in policy.widths)
    assert 2 * draft.config.hidden_size + STAT_FEATURES == policy.router.norm.normalized_shape[0]
    assert torch.isfinite(torch.tensor([s for row in spec.generate(prompts(1), max_new_tokens=20).scores
                                        for s in row])).all()
