"""Step policies: who writes each step. Like diffusers' schedulers, a policy only decides; the loop lives
in `StepSpeculator`. `decide(view)` returns per-row scores and which draft steps are kept."""

from __future__ import annotations

import hashlib
import math
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from specmm.core.sampling import SamplingConfig
from specmm.reasoning.judge import SCORE_METHODS, JudgeTemplate

ORACLE_SAMPLING = SamplingConfig(1.0)  # target samples for oracle advantages need spread


@runtime_checkable
class StepView(Protocol):
    """What a policy may look at when deciding the current step of every live row."""

    draw: object  # StepDraw of the draft's candidate step
    steps_done: Tensor  # [B] steps already written
    target_steps: Tensor  # [B] of those, written by the target
    last_by_target: Tensor  # [B] bool: previous step written by the target
    budget: Tensor  # [B] step token budget
    row_keys: list[int]  # [B] each row's own key (its seed, or its prompt index): per-row randomness

    def judge(self, suffix_ids: tuple[int, ...]) -> Tensor:
        """Append [pending, draft step, suffix] to the target in one round; [B, V] logits after the suffix."""
        ...

    def contexts(self) -> list[list[int]]:
        """Per row: prompt + completion so far (token ids, no padding)."""
        ...

    def steps(self) -> list[list[int]]:
        """Per row: the draft's candidate step."""
        ...

    def target_steps_sample(self, count: int, generator: torch.Generator) -> list[list[list[int]]]:
        """`count` target steps per row sampled from the same context (nothing is committed)."""
        ...


class StepPolicy:
    """Base: `proposes` (the draft writes a candidate), `uses_target`, `judges` (decide opens a target round).

    A judging policy names its judge suffix in `judge_suffix`, so the row-asynchronous schedule can run the
    judge prefill inside the target's batched forward of an iteration."""

    name = "policy"
    proposes = True
    uses_target = True
    judges = False
    exact = False
    needs_features = False
    judge_suffix: tuple[int, ...] | None = None

    def bind(self, speculator) -> None:
        """Check the policy fits the speculator's models and tokenizer (ValueError otherwise) and take what it
        reads from them. Called when a speculator is made and again when it generates, so one policy object
        can serve several speculators: it always reads the one that runs."""

    def decide(self, view: StepView) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class TargetOnly(StepPolicy):
    """The target writes every step (the baseline; no draft is run)."""

    name, proposes, exact = "target-only", False, True

    def decide(self, view):  # pragma: no cover - never called
        raise RuntimeError("TargetOnly does not decide")


class DraftOnly(StepPolicy):
    """The draft writes every step unchecked (no target is run)."""

    name, uses_target = "draft-only", False

    def decide(self, view):
        rows = view.steps_done.shape[0]
        return torch.full((rows,), math.nan), torch.ones(rows, dtype=torch.bool, device=view.steps_done.device)


def _check_threshold(value, low: float, high: float, scale: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high:
        raise ValueError(f"threshold: expected a number in [{low}, {high}] ({scale}), got {value!r}")
    return float(value)


class SpecReason(StepPolicy):
    """Keep the draft step iff the target's judge score (0-9, read from its next-token distribution after
    the judge prompt) is >= threshold; otherwise the target regenerates the step (Pan et al., 2025)."""

    judges = True

    def __init__(self, threshold: float = 7, template: JudgeTemplate | None = None, method: str = "greedy"):
        self.threshold = _check_threshold(threshold, 0, 9, "the judge's 0-9 scale")
        if method not in SCORE_METHODS:
            raise ValueError(f"method: expected one of {SCORE_METHODS}, got {method!r}")
        self.template, self.method = template, method
        self.given_template = template  # None: the template comes from the bound speculator's chat template
        self.name = f"specreason(t={threshold:g})"

    @property
    def judge_suffix(self) -> tuple[int, ...] | None:
        return self.template.suffix_ids if self.template is not None else None

    def bind(self, speculator) -> None:
        template = self.given_template or JudgeTemplate.for_chat_model(speculator.tokenizer)
        vocab = speculator.vocab_size
        if max(template.suffix_ids + template.digits) >= vocab:
            raise ValueError(f"template: token ids outside the models' vocabulary of {vocab}")
        self.template = template

    def decide(self, view):
        scores = self.template.score(view.judge(self.template.suffix_ids), self.method)
        return scores, scores >= self.threshold


class Arbitrage(StepPolicy):
    """Escalate to the target iff the router's P(target step better) > threshold (Maheswaran et al., 2025);
    the router reads draft-side features only."""

    needs_features = True

    def __init__(self, router, threshold: float = 0.5):
        self.threshold = _check_threshold(threshold, 0, 1, "a probability")
        self.router = router
        self.name = f"arbitrage(t={threshold:g})"

    def bind(self, speculator) -> None:
        self.router.check(speculator.draft_hidden_size)

    def decide(self, view):
        p_escalate = self.router.predict(view)
        return p_escalate, p_escalate <= self.threshold


class RewardThreshold(StepPolicy):
    """Keep the draft step iff a sequence-classification scorer rates context + step >= threshold (RSD-style).

    The scorer is any HF `*ForSequenceClassification` on the same vocabulary (or with `scorer_tokenizer`,
    fed the decoded text): one label gives the raw score, more labels the probability of the last label."""

    def __init__(self, scorer, threshold: float, scorer_tokenizer=None):
        if not hasattr(scorer, "config") or not hasattr(scorer, "score") and not hasattr(scorer, "classifier"):
            raise ValueError(f"scorer: expected a HF *ForSequenceClassification model, got {type(scorer).__name__}")
        self.threshold = _check_threshold(threshold, -math.inf, math.inf, "the scorer's output")
        self.scorer, self.scorer_tokenizer = scorer, scorer_tokenizer
        self.name = f"reward(t={threshold:g})"

    def bind(self, speculator) -> None:
        self.tokenizer = speculator.tokenizer
        scorer_vocab = self.scorer.config.get_text_config().vocab_size
        if self.scorer_tokenizer is None and scorer_vocab < speculator.vocab_size:
            raise ValueError(f"scorer: vocabulary of {scorer_vocab} is smaller than the models' "
                             f"{speculator.vocab_size}; pass scorer_tokenizer")

    @torch.no_grad()
    def decide(self, view):
        device = next(self.scorer.parameters()).device
        rows = [c + s for c, s in zip(view.contexts(), view.steps())]
        if self.scorer_tokenizer is not None:
            rows = [self.scorer_tokenizer.encode(self.tokenizer.decode(r)) for r in rows]
        width = max(len(r) for r in rows)
        pad = self.scorer.config.pad_token_id if self.scorer.config.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(rows):  # left padding: the last position is every row's last token
            ids[b, width - len(r):], mask[b, width - len(r):] = torch.tensor(r), 1
        logits = self.scorer(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()  # [B, C]
        reward = logits[:, 0] if logits.shape[1] == 1 else logits.softmax(-1)[:, -1]
        reward = reward.to(view.steps_done.device)
        return reward, reward >= self.threshold


def row_uniform(*key: int) -> float:
    """A U[0, 1) draw that depends only on `key` (counter-based: no stream shared between rows)."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0 ** -53


class RandomRouting(StepPolicy):
    """Escalate each step with probability p, independently of its content: the control at matched acceptance.

    Each row owns its draws: the draw for a row's n-th step is a function of (seed, the row's key, n), so a
    row decides the same whatever else is in the batch and whichever schedule runs it."""

    def __init__(self, p: float, seed: int = 0):
        self.p = _check_threshold(p, 0, 1, "an escalation probability")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an integer, got {seed!r}")
        self.seed = seed
        self.name = f"random(p={p:.2f})"

    def decide(self, view):
        steps = view.steps_done.tolist()
        draws = torch.tensor([row_uniform(self.seed, key, step) for key, step in zip(view.row_keys, steps)],
                             dtype=torch.float64)
        device = view.steps_done.device
        return draws.float().to(device), (draws >= self.p).to(device)


class OracleRouting(StepPolicy):
    """Escalate iff the advantage of the target over the draft, under a step scorer and averaged over
    `samples` target steps, exceeds `threshold`; records (features, advantage) to train routers."""

    needs_features = True

    def __init__(self, scorer, samples: int = 4, threshold: float = 0.0, seed: int = 0, record: bool = True):
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples: expected an integer >= 1, got {samples!r}")
        self.scorer, self.samples, self.threshold = scorer, samples, float(threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.record = record
        self.features: list[Tensor] = []
        self.advantages: list[Tensor] = []
        self.name = f"oracle(t={threshold:g})"

    def decide(self, view):
        from specmm.reasoning.router import draft_features

        contexts, steps = view.contexts(), view.steps()
        draft_scores = torch.tensor(self.scorer(contexts, steps), dtype=torch.float32)
        samples = view.target_steps_sample(self.samples, self.generator)
        target_scores = torch.tensor([[self.scorer([c], [s])[0] for s in row] for c, row in zip(contexts, samples)],
                                     dtype=torch.float32).mean(1)
        advantage = (target_scores - draft_scores).to(view.steps_done.device)
        if self.record:
            self.features.append(draft_features(view).cpu())
            self.advantages.append(advantage.cpu())
        return advantage, advantage <= self.threshold
