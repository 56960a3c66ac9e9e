"""Training the image drafter on the target's own features (both guidance halves), EAGLE-1 style.

Loss = SmoothL1(predicted feature, target feature) + ce_weight * CE(target soft labels, drafter logits),
with uniform noise on the input features, as LANTERN trains its drafter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from specmm.image_ar.drafter import ImageDrafter


@dataclass
class DrafterTrainConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    ce_weight: float = 0.1
    feature_noise: float = 0.2
    uncond_fraction: float = 0.5  # share of rows trained on the null condition (the uncond half)
    grad_clip: float = 0.5


def drafter_loss(drafter: ImageDrafter, conditions: Tensor, tokens: Tensor, ce_weight: float = 0.1,
                 feature_noise: float = 0.0, generator: torch.Generator | None = None) -> tuple[Tensor, dict]:
    """Teacher-forced loss on image tokens [B, N] under conditions [B] (class ids, null ids allowed)."""
    gpt, head = drafter.gpt, drafter.head
    with torch.no_grad():
        logits, features = gpt(conditions, tokens, return_features=True)  # [B, N, V], [B, N, d]
    inputs = features[:, :-1]
    if feature_noise > 0:
        noise = torch.rand(inputs.shape, generator=generator).to(inputs.device) - 0.5
        inputs = inputs + noise * feature_noise
    cells = torch.arange(tokens.shape[1] - 1, device=tokens.device).expand(tokens.shape[0], -1)
    predicted = head(gpt.tok_embeddings(tokens[:, :-1]).detach(), inputs, cells, None)  # [B, N-1, d]
    feature_loss = F.smooth_l1_loss(predicted, features[:, 1:])
    soft = logits[:, 1:].softmax(-1)
    ce = -(soft * gpt.logits(predicted).log_softmax(-1)).sum(-1).mean()
    with torch.no_grad():
        top1 = (gpt.logits(predicted).argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    return feature_loss + ce_weight * ce, {"feature": float(feature_loss.detach()), "ce": float(ce.detach()), "top1": float(top1)}


def train_drafter(drafter: ImageDrafter, codes: Tensor, labels: Tensor, config: DrafterTrainConfig | None = None,
                  seed: int = 0, progress: bool = True, start_step: int = 0, optimizer=None,
                  on_step=None) -> Iterator[dict]:
    """Train on (codes [M, N], labels [M]); yields metrics per step. Null-class rows train the uncond half."""
    config = config or DrafterTrainConfig()
    gen = torch.Generator().manual_seed(seed)
    for p in drafter.gpt.parameters():
        p.requires_grad_(False)
    drafter.head.train()
    optimizer = optimizer or torch.optim.AdamW(drafter.head.parameters(), lr=config.lr, betas=(0.9, 0.95))
    null = drafter.gpt.config.num_classes
    bar = tqdm(range(start_step, config.steps), disable=not progress, desc="image drafter")
    for step in bar:
        gen.manual_seed(seed * 100003 + step)  # resumable: each step's batch depends only on the step
        index = torch.randint(len(codes), (config.batch_size,), generator=gen)
        conditions = labels[index].clone()
        drop = torch.rand(config.batch_size, generator=gen) < config.uncond_fraction
        if drafter.gpt.config.has_null_class:
            conditions[drop] = null
        loss, metrics = drafter_loss(drafter, conditions.to(drafter.device), codes[index].to(drafter.device),
                                     config.ce_weight, config.feature_noise, gen)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.head.parameters(), config.grad_clip)
        optimizer.step()
        bar.set_postfix(loss=f"{float(loss):.3f}", top1=f"{metrics['top1']:.2f}")
        if on_step is not None:
            on_step(step, optimizer)
        yield {"step": step, "loss": float(loss), **metrics}
    drafter.head.eval()
