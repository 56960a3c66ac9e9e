"""Arbitrage router: balanced labels, learnability, persistence, and the policy's limits."""

from __future__ import annotations

import torch

from specmm.reasoning import (
    Arbitrage,
    DraftOnly,
    OracleRouting,
    StepSpeculator,
    TargetOnly,
    train_router,
)
from specmm.reasoning.router import (
    STAT_FEATURES,
    RouterConfig,
    StepRouter,
    balanced_labels,
)
from specmm.zoo.chainarith_task import StepChecker
from tests.reasoning.helpers import models, prompts, step_ids


def test_balanced_labels_have_equal_classes_and_follow_the_advantage_sign():
    advantages = torch.tensor([0.5, -0.2, 0.0, 0.0, 0.25, -1.0, 0.0, 0.75])
    index, labels = balanced_labels(advantages)
    assert labels.sum() * 2 == labels.numel() == 6  # 3 positive, 5 not: 3 of each kept
    assert torch.equal(labels, (advantages[index] > 0).long())


def test_router_learns_a_signal_in_one_feature_and_generalises():
    hidden = 8
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1200, 2 * hidden + STAT_FEATURES, generator=gen)
    advantages = torch.where(features[:, -3] > 0.3, 0.5, -0.25)  # imbalanced: ~38% positive
    router, stats = train_router(features[:1000], advantages[:1000], hidden, steps=200)
    with torch.no_grad():
        predicted = router(features[1000:]) > 0
    assert stats["balanced_examples"] < 1000
    assert (predicted == (advantages[1000:] > 0)).float().mean() > 0.9


def test_saved_router_predicts_the_same(tmp_path):
    router = StepRouter(RouterConfig(hidden_size=8))
    router.save_pretrained(tmp_path)
    loaded = StepRouter.from_pretrained(tmp_path)
    x = torch.randn(5, 2 * 8 + STAT_FEATURES)
    torch.testing.assert_close(router(x), loaded(x))


def test_arbitrage_thresholds_one_and_zero_reduce_to_draft_only_and_target_only():
    tokenizer, target, draft = models()
    torch.manual_seed(0)
    router = StepRouter(RouterConfig(hidden_size=draft.config.hidden_size)).double().eval()
    outs = {}
    for name, policy in (("never", Arbitrage(router, 1.0)), ("always", Arbitrage(router, 0.0)),
                         ("draft", DraftOnly()), ("target", TargetOnly())):
        spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=6)
        outs[name] = spec.generate(prompts(2), max_new_tokens=18)
    assert torch.equal(outs["never"].completion_ids, outs["draft"].completion_ids)
    assert torch.equal(outs["always"].completion_ids, outs["target"].completion_ids)
    scores = [s for row in outs["never"].scores for s in row]
    assert all(0 < s < 1 for s in scores)


def test_oracle_routing_escalates_exactly_when_target_samples_beat_the_draft():
    tokenizer, target, draft = models()

    def scorer(contexts, steps):  # a deterministic stand-in for a checker: prefers steps with many 1s
        return [float(sum(t == 7 for t in s)) for s in steps]

    policy = OracleRouting(scorer, samples=3, seed=0)
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=6)
    out = spec.generate(prompts(2), max_new_tokens=18)
    advantages = torch.cat(policy.advantages)
    pairs = [(s, d) for scores, decisions in zip(out.scores, out.decisions) for s, d in zip(scores, decisions)]
    assert torch.cat(policy.features).shape[0] == advantages.numel() == len(pairs)
    assert sorted(advantages.tolist()) == sorted(s for s, _ in pairs)
    assert all(kept == (score <= 0) for score, kept in pairs) and {d for _, d in pairs} == {True, False}
    assert StepChecker(tokenizer)([tokenizer.encode(prompts(1)[0])], [[1, 2]]) == [0.0]
