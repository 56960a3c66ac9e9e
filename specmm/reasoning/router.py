"""Arbitrage's router: P(the target would write a better step) from draft-side information only.

Features come for free from the draft's own step: its final hidden states (mean and last over the step),
token log-probs and entropies, the step's length and index, and which model wrote the earlier steps.
Labels are 1[advantage > 0] with the advantage averaged over several target samples, class-balanced.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

logger = logging.getLogger(__name__)

STAT_FEATURES = 8


def draft_features(view) -> Tensor:
    """[B, 2H + 8] float32 features of each row's draft step."""
    draw = view.draw
    if draw.hidden is None:
        raise ValueError("policy: router features need the draft's hidden states (needs_features=True)")
    lengths = draw.lengths.clamp_min(1)  # [B]
    width = draw.tokens.shape[1]
    in_step = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]  # [B, S]
    weights = in_step.float() / lengths[:, None].float()
    hidden = draw.hidden.float()  # [B, S, H]
    mean_hidden = (hidden * weights[:, :, None]).sum(1)
    last_hidden = hidden[torch.arange(hidden.shape[0]), lengths - 1]
    logp = draw.logprobs.float()
    mean_logp = (logp * weights).sum(1)
    min_logp = torch.where(in_step, logp, 0.0).min(1).values
    entropy = draw.entropy.float()
    steps = view.steps_done.float()
    stats = torch.stack([mean_logp, min_logp, (entropy * weights).sum(1),
                         torch.where(in_step, entropy, 0.0).max(1).values,
                         lengths.float() / view.budget.float().clamp_min(1), steps / 16.0,
                         view.target_steps.float() / steps.clamp_min(1), view.last_by_target.float()], 1)
    return torch.cat([mean_hidden, last_hidden, stats], 1)


@dataclass
class RouterConfig:
    hidden_size: int  # the draft's hidden size
    width: int = 64


class StepRouter(nn.Module):
    """A small classifier head on the draft's features (normalised, one hidden layer)."""

    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config
        inputs = 2 * config.hidden_size + STAT_FEATURES
        self.norm = nn.LayerNorm(inputs)
        self.mlp = nn.Sequential(nn.Linear(inputs, config.width), nn.GELU(), nn.Linear(config.width, 1))

    def forward(self, features: Tensor) -> Tensor:
        """[B, F] -> [B] logits of P(escalate)."""
        return self.mlp(self.norm(features))[:, 0]

    def check(self, draft_hidden_size: int) -> None:
        if draft_hidden_size != self.config.hidden_size:
            raise ValueError(f"router: trained on draft features of size {self.config.hidden_size}, the draft "
                             f"has {draft_hidden_size}")

    @torch.no_grad()
    def predict(self, view) -> Tensor:
        weight = next(self.parameters())
        return self(draft_features(view).to(weight.device, weight.dtype)).sigmoid().float().to(view.steps_done.device)

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(vars(self.config)))

    @classmethod
    def from_pretrained(cls, folder: str | Path, device="cpu") -> StepRouter:
        folder = Path(folder)
        router = cls(RouterConfig(**json.loads((folder / "config.json").read_text())))
        router.load_state_dict(load_file(folder / "model.safetensors"))
        return router.to(device).eval()


def balanced_labels(advantages: Tensor, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(indices, labels): y = 1[advantage > 0], the majority class randomly down-sampled to the minority's size."""
    labels = (advantages > 0).long()
    positive, negative = labels.nonzero().flatten(), (labels == 0).nonzero().flatten()
    count = min(positive.numel(), negative.numel())
    if count == 0:  # one class only (e.g. untrained models): nothing to balance
        logger.warning("router labels: every step has label %d; the router can only learn a constant", int(labels[0]))
        return torch.arange(labels.numel()), labels
    gen = torch.Generator().manual_seed(seed)
    keep = torch.cat([positive[torch.randperm(positive.numel(), generator=gen)[:count]],
                      negative[torch.randperm(negative.numel(), generator=gen)[:count]]])
    return keep, labels[keep]


def train_router(features: Tensor, advantages: Tensor, hidden_size: int, *, steps: int = 300, lr: float = 3e-3,
                 batch_size: int = 256, seed: int = 0) -> tuple[StepRouter, dict]:
    """Fit a StepRouter on class-balanced labels; returns the router and training figures."""
    keep, labels = balanced_labels(advantages, seed)
    x, y = features[keep].float(), labels.float()
    torch.manual_seed(seed)
    router = StepRouter(RouterConfig(hidden_size))
    optimizer = torch.optim.AdamW(router.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen)
        loss = F.binary_cross_entropy_with_logits(router(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    router.eval()
    with torch.no_grad():
        predicted = router(x) > 0
    return router, {"examples": int(features.shape[0]), "balanced_examples": int(x.shape[0]),
                    "positive_share": float((advantages > 0).float().mean()),
                    "train_accuracy": float((predicted == y.bool()).float().mean()), "final_loss": float(loss.detach())}
