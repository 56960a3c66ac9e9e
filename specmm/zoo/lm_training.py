"""A small, deterministic, resumable trainer for causal LMs (text or vision-language).

The batch of step s is a pure function of (seed, s) (`make_batch(step)`), and checkpoints hold the model,
optimiser, schedule and loss history; so a run killed at any point and resumed from its last checkpoint
ends with exactly the weights of an uninterrupted run.

GPU recipes add `device` (train there, then hand the model back where it was, so a builder's evaluation code
is unchanged), `precision="bfloat16"` (autocast), `fused` (fused AdamW) and `compile` (a compiled forward + loss);
left at their defaults, as every CPU recipe leaves them, training runs exactly as before.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from specmm.core.draft_distill import text_windows
from specmm.jobs import atomic_writer

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class LMTrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    checkpoint_every: int = 50
    seed: int = 0
    device: str | None = None  # None: where the model is
    precision: str = "float32"  # or "bfloat16": autocast on the training device, weights and optimiser in fp32
    fused: bool = False  # fused AdamW (CUDA)
    compile: bool = False  # torch.compile the forward + loss (fixed batch shapes: compiles once)

    def __post_init__(self) -> None:
        if self.precision not in ("float32", "bfloat16"):
            raise ValueError(f"precision: expected float32 or bfloat16, got {self.precision!r}")


# What every `gpu` recipe's training adds (H100 budget: each suite step, build included, within 9 minutes; the
# recipes' time estimates assume ~400 TFLOP/s of bf16 for 6 x parameters x tokens training FLOPs).
GPU_TRAINING = dict(device="cuda", precision="bfloat16", fused=True, compile=True)
GPU_TRAINING_EAGER = {**GPU_TRAINING, "compile": False}  # models whose training forward does not compile cleanly

IGNORE = -100  # label of positions that carry no loss


def token_windows(tokens: Tensor, config: LMTrainConfig) -> Callable[[int], dict[str, Tensor]]:
    """Batches of [B, seq_len] windows of a flat token array at offsets seeded by (seed, step)."""

    windows = text_windows(tokens, config.batch_size, config.seq_len, config.seed)

    def make_batch(step: int) -> dict[str, Tensor]:
        window = windows(step)
        return {"input_ids": window, "labels": window}

    return make_batch


def next_token_loss(logits: Tensor, labels: Tensor, weights: Tensor | None = None) -> Tensor:
    """Cross-entropy of logits[:, t] against labels[:, t + 1], skipping IGNORE labels; with `weights` [B, L]
    (one per label), the weighted mean, so a rare target (one judge digit per example) can count more."""
    flat_logits, flat_labels = logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten()
    if weights is None:
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE)
    losses = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE, reduction="none")
    w = weights[:, 1:].flatten().float() * (flat_labels != IGNORE)
    return (losses * w).sum() / w.sum().clamp_min(1e-8)


def _lr_factor(step: int, config: LMTrainConfig) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Next-token loss of `model(**inputs)` against `batch["labels"]` (weighted by `batch["weights"]` if given)."""
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "weights")}
    return next_token_loss(model(**inputs).logits, batch["labels"], batch.get("weights"))


def train_causal_lm(model: nn.Module, make_batch: Callable[[int], dict[str, Tensor]], config: LMTrainConfig,
                    workdir: Path, *, desc: str = "train", progress: bool = True,
                    after_step: Callable[[int], None] | None = None,
                    loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor] = lm_loss) -> list[float]:
    """Train `model` on `make_batch(step)` (model inputs plus `labels`; next-token loss by default).

    Resumes from `workdir/checkpoint.pt`. Returns the losses of all steps, resumed ones included.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    home = next(model.parameters()).device
    if config.device is not None:
        model.to(config.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    fused = {"fused": True} if config.fused else {}  # absent, not False: the CPU path builds the same optimiser
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95),
                                  **fused)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    losses: list[float] = []
    start = 0
    checkpoint = workdir / CHECKPOINT
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start, losses = state["step"], state["losses"]
        logger.info("%s: resuming at step %d of %d", desc, start, config.steps)
    device = next(model.parameters()).device
    model.train()
    step_loss = _step_loss(model, loss_fn, config, device)
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=desc, disable=not progress)
    for step in bar:
        loss = step_loss({k: v.to(device, non_blocking=True) for k, v in make_batch(step).items()})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        done = step + 1
        if done % config.checkpoint_every == 0 or done == config.steps:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "step": done, "losses": losses}
            with atomic_writer(checkpoint) as f:  # a kill never leaves half a checkpoint
                torch.save(state, f)
        if after_step is not None:
            after_step(done)
    model.eval()
    model.to(home)
    return losses


def _step_loss(model: nn.Module, loss_fn, config: LMTrainConfig, device: torch.device):
    """The loss of one batch as the config asks: plain (CPU recipes), under bf16 autocast, and/or compiled."""
    if config.precision == "float32" and not config.compile:
        return lambda batch: loss_fn(model, batch)

    def step(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "bfloat16"):
            return loss_fn(model, batch)

    backend = os.environ.get("SPECMM_COMPILE_BACKEND", "inductor")  # as specmm.core.compiled: tests use aot_eager
    return torch.compile(step, backend=backend) if config.compile else step


def save_trained_lm(model: nn.Module, tokenizer, folder: Path, losses: list[float], config: LMTrainConfig,
                     files=None) -> dict:
    """Save a trained model with `files` (its tokenizer or processor; default `tokenizer`), generation using the
    tokenizer's pad/eos ids; returns the record every zoo entry keeps: parameters, steps, and the mean loss of the
    last 5% of steps."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    (files or tokenizer).save_pretrained(folder)
    tail = losses[-max(1, len(losses) // 20):]
    return {"parameters": sum(p.numel() for p in model.parameters()), "steps": config.steps,
            "final_train_loss": sum(tail) / len(tail)}


@torch.no_grad()
def heldout_loss(model: nn.Module, tokens: Tensor, seq_len: int, windows: int = 32, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats per token) over evenly spaced held-out windows."""
    model.eval()
    device = next(model.parameters()).device
    count = min(windows, max(1, (tokens.numel() - 1) // (seq_len + 1)))
    starts = torch.linspace(0, tokens.numel() - seq_len - 2, count).long().tolist()
    total, n = 0.0, 0
    for i in range(0, len(starts), batch_size):
        batch = torch.stack([tokens[s: s + seq_len + 1] for s in starts[i: i + batch_size]]).long().to(device)
        logits = model(input_ids=batch[:, :-1]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
        n += batch[:, 1:].numel()
    return total / n
