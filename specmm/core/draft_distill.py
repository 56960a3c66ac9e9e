"""Align a small draft LM with its target by distillation, so more of its drafts are accepted.

A draft trained on the same data as the target still disagrees with it wherever the target has its own habits;
speculative decoding only profits where they agree. Distillation (DistillSpec, Zhou et al. 2023; STree drafts
with a KL-distilled Mamba2) trains the draft on the target's next-token distributions instead of the data's one-hot
labels. Loss per real position t, at temperature T:

    KL(softmax(target_logits_t / T) || softmax(draft_logits_t / T)) * T^2

Target logits are computed on the fly (no_grad); nothing is stored. The draft keeps its architecture and its
vocabulary, which must be the target's (the engine refuses a draft whose logits are another width).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from specmm.core.eagle_train import train_head
from specmm.core.target import output_vocab_size

Batch = Tensor | tuple[Tensor, Tensor]  # input_ids [B, L], or (input_ids, attention_mask) [B, L] each


@dataclass
class DistillConfig:  # an `eagle_train.TrainSchedule`, plus the distillation temperature
    steps: int = 500
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0  # value clipping, as every drafter head trained by specmm
    checkpoint_every: int = 100
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f"DistillConfig: steps >= 1, temperature > 0 and lr > 0 expected, got steps={self.steps},"
                             f" temperature={self.temperature}, lr={self.lr}")


def distillation_loss(draft_logits: Tensor, target_logits: Tensor, attention_mask: Tensor,
                      temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """(loss, top-1 agreement) over the real positions.

    draft_logits, target_logits: [B, L, V]; attention_mask: [B, L] (1 = real token).
    """
    weight = attention_mask.to(torch.float32)
    count = weight.sum().clamp_min(1.0)
    target_log_probs = (target_logits.float() / temperature).log_softmax(-1)
    draft_log_probs = (draft_logits.float() / temperature).log_softmax(-1)
    per_position = (target_log_probs.exp() * (target_log_probs - draft_log_probs)).sum(-1)  # [B, L]
    loss = (per_position * weight).sum() / count * temperature**2
    agree = ((draft_logits.argmax(-1) == target_logits.argmax(-1)).float() * weight).sum() / count
    return loss, agree


@torch.no_grad()
def heldout_comparison(draft_model: nn.Module, target_model: nn.Module, input_ids: Tensor,
                       temperature: float = 1.0) -> dict[str, float]:
    """{"kl", "top1_agreement"} of the draft against the target on held-out windows input_ids [B, L] (no padding):
    what distillation lowers and raises."""
    kl, top1 = distillation_loss(draft_model(input_ids=input_ids).logits, target_model(input_ids=input_ids).logits,
                                 torch.ones_like(input_ids), temperature)
    return {"kl": kl.item(), "top1_agreement": top1.item()}


def text_windows(tokens: Tensor, batch_size: int, seq_len: int, seed: int = 0) -> Callable[[int], Tensor]:
    """step -> [batch_size, seq_len] windows of a flat token stream at offsets drawn from (seed, step): a batch is a
    pure function of its step, so a resumed run sees exactly the batches an uninterrupted one would."""
    if tokens.dim() != 1 or tokens.numel() <= seq_len + 1:
        raise ValueError(f"tokens: a flat stream longer than seq_len + 1 = {seq_len + 1} is needed, got shape "
                         f"{tuple(tokens.shape)}")

    def make_batch(step: int) -> Tensor:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=gen)
        return torch.stack([tokens[s: s + seq_len] for s in starts.tolist()]).long()

    return make_batch


class _WholeModel:
    """The trainer every drafter head shares trains `.head`; distillation trains the whole draft model."""

    def __init__(self, model: nn.Module):
        self.head = model
        self.device = next(model.parameters()).device

    def save_pretrained(self, path: Path) -> None:
        self.head.save_pretrained(path)


def distill_draft(draft_model: nn.Module, target_model: nn.Module, batches: Callable[[int], Batch] | Sequence[Batch],
                  config: DistillConfig | None = None, *, checkpoint_dir: str | Path | None = None,
                  progress: bool = True, on_step: Callable[[int, float, dict], None] | None = None) -> list[float]:
    """Distil `target_model` into `draft_model` (both HF causal LMs with one vocabulary) for `config.steps` steps.

    `batches`: `step -> batch`, or a sequence of batches taken in turn (batch `step % len`); either way a resumed
    run sees the batches an uninterrupted one would. With `checkpoint_dir`, the draft and the optimiser
    are saved every `checkpoint_every` steps and a later call resumes there. Returns the loss of every step run by
    this call; `on_step(step, loss, {"top1": agreement})` sees each step.
    """
    config = config or DistillConfig()
    draft_size, target_size = output_vocab_size(draft_model), output_vocab_size(target_model)
    if draft_size != target_size:
        raise ValueError(f"draft_model: its logits have {draft_size} entries, the target's {target_size}; distillation "
                         "needs a draft with the target's vocabulary")
    device = next(draft_model.parameters()).device
    target_device = next(target_model.parameters()).device
    target_model.eval()
    if not callable(batches) and not len(batches):
        raise ValueError("batches: no batches to distil on")
    batch_at = batches if callable(batches) else (lambda step: batches[step % len(batches)])

    def step_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        batch = batch_at(step)
        ids, mask = batch if isinstance(batch, (tuple, list)) else (batch, torch.ones_like(batch))
        with torch.no_grad():
            target_logits = target_model(input_ids=ids.to(target_device),
                                         attention_mask=mask.to(target_device)).logits.to(device)
        ids, mask = ids.to(device), mask.to(device)
        loss, agree = distillation_loss(draft_model(input_ids=ids, attention_mask=mask).logits, target_logits, mask,
                                        config.temperature)
        return loss, {"top1": agree.item()}

    return train_head(_WholeModel(draft_model), step_loss, config, checkpoint_dir=checkpoint_dir, desc="distill",
                      progress=progress, on_step=on_step)
