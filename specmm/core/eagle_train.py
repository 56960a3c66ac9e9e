"""Distil an EAGLE head from its target: target features are computed on the fly, nothing is stored.

Loss per position (EAGLE-1/2): SmoothL1(predicted feature, next target feature)
+ ce_weight * cross-entropy(LM head of the prediction, softmax of the LM head of the true feature).
Input features get uniform noise, as upstream, so the head tolerates its own imperfect predictions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from specmm.core.eagle import EagleDrafter
from specmm.core.target import final_norm
from specmm.jobs import atomic_writer

logger = logging.getLogger(__name__)


class TrainSchedule(Protocol):
    """What `train_head` reads of a config: `EagleTrainConfig` (and the VLM drafters' subclass) and the draft
    distillation's `DistillConfig` each carry these, with their own defaults."""

    steps: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    grad_clip: float
    checkpoint_every: int


@dataclass
class EagleTrainConfig:
    steps: int = 1000
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 50
    feature_noise: float = 0.2  # width of the uniform noise added to input features
    ce_weight: float = 0.1
    grad_clip: float = 0.5
    checkpoint_every: int = 200


def target_features(target_model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, L] -> [B, L, H] last-layer features (the final norm's output), without the full LM head."""
    norm = final_norm(target_model)
    if norm is None:
        raise ValueError(f"target: cannot find the final norm of {type(target_model).__name__}")
    captured = {}
    hook = norm.register_forward_hook(lambda module, args, out: captured.__setitem__("features", out))
    try:
        with torch.no_grad():
            target_model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1)
    finally:
        hook.remove()
    return captured["features"]


def eagle_loss(drafter: EagleDrafter, features: Tensor, input_ids: Tensor, attention_mask: Tensor,
               config: EagleTrainConfig) -> Tensor:
    """Teacher-forced loss: pair t = (f_t, x_{t+1}) predicts f_{t+1}."""
    inputs = features[:, :-1]
    if config.feature_noise:
        inputs = inputs + (torch.rand_like(inputs) - 0.5) * config.feature_noise
    head_mask = attention_mask[:, 1:] * attention_mask[:, :-1]  # [B, L-1] pairs made of real tokens
    out = drafter.head(drafter.embed_tokens(input_ids[:, 1:]), inputs, attention_mask=head_mask)
    predicted, wanted = out.last_hidden_state, features[:, 1:]
    weight = head_mask.to(predicted.dtype)[..., None]
    count = weight.sum().clamp_min(1.0)
    regression = (F.smooth_l1_loss(predicted, wanted, reduction="none") * weight).sum() / (count * wanted.shape[-1])
    with torch.no_grad():
        soft_labels = drafter.lm_head(wanted).float().softmax(-1)
    log_probs = drafter.lm_head(predicted).float().log_softmax(-1)
    cross_entropy = -((soft_labels * log_probs).sum(-1) * weight[..., 0]).sum() / count
    return regression + config.ce_weight * cross_entropy


def _pair(item) -> tuple[Tensor, Tensor]:
    """(ids, mask) of a batch given as ids alone (every token real) or as the pair."""
    return tuple(item) if isinstance(item, (tuple, list)) else (item, torch.ones_like(item))


def _batches(data: Iterable) -> Iterator[tuple[Tensor, Tensor]]:
    while True:
        empty = True
        for item in data:
            empty = False
            yield _pair(item)
        if empty:
            raise ValueError("batches: the dataset yielded nothing")


def train_eagle(drafter: EagleDrafter, target_model: nn.Module, batches: Iterable | Callable[[int], object],
                config: EagleTrainConfig | None = None, *, checkpoint_dir: str | Path | None = None,
                progress: bool = True) -> list[float]:
    """Train `drafter.head` for `config.steps` steps over `batches` (LongTensor [B, L] or (ids, mask)): an iterable,
    cycled, or `step -> batch`, which a resumed run reads from the step it resumes at.

    With `checkpoint_dir`, the head and optimiser are saved every `checkpoint_every` steps and a later call
    resumes from the last checkpoint. Returns the loss of every step run by this call.
    """
    config = config or EagleTrainConfig()
    device = next(drafter.head.parameters()).device
    target_model.eval()
    data = None if callable(batches) else _batches(batches)

    def step_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        ids, mask = (t.to(device) for t in (_pair(batches(step)) if data is None else next(data)))
        return eagle_loss(drafter, target_features(target_model, ids, mask), ids, mask, config), {}

    return train_head(drafter, step_loss, config, checkpoint_dir=checkpoint_dir, desc="eagle", progress=progress)


def train_head(drafter, step_loss: Callable[[int], tuple[Tensor, dict[str, float]]], config: TrainSchedule, *,
               checkpoint_dir: str | Path | None = None, desc: str = "drafter", progress: bool = True,
               on_step: Callable[[int, float, dict], None] | None = None) -> list[float]:
    """The optimisation loop every drafter head shares: AdamW with linear warm-up, value clipping, a tqdm
    bar, checkpoints every `checkpoint_every` steps and resume. `step_loss(step)` gives the step's loss and
    figures to show (and pass to `on_step`). Returns the loss of every step run by this call."""
    params = [p for p in drafter.head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(config.warmup_steps, 1)))
    start = resume_checkpoint(drafter, optimizer, schedule, checkpoint_dir)
    drafter.head.train()
    losses = []
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=desc, disable=not progress)
    for step in bar:
        loss, parts = step_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, config.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}", **{k: f"{v:.2f}" for k, v in parts.items()})
        if on_step is not None:
            on_step(step, losses[-1], parts)
        if checkpoint_dir is not None and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
            save_checkpoint(drafter, optimizer, schedule, step + 1, checkpoint_dir)
    drafter.head.eval()
    return losses


def save_checkpoint(drafter, optimizer, schedule, step: int, checkpoint_dir) -> None:
    """Save the head (for users) and one `trainer_state.pt` holding everything a resume needs: the head's weights,
    the optimiser, the schedule and the random state. That file is written atomically and alone decides where a
    resume starts, so a kill at any moment resumes exactly as the uninterrupted run continues."""
    path = Path(checkpoint_dir)
    drafter.save_pretrained(path)
    state = {"step": step, "head": drafter.head.state_dict(), "optimizer": optimizer.state_dict(),
             "schedule": schedule.state_dict(), "rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    with atomic_writer(path / "trainer_state.pt") as f:
        torch.save(state, f)


def resume_checkpoint(drafter, optimizer, schedule, checkpoint_dir) -> int:
    if checkpoint_dir is None or not (Path(checkpoint_dir) / "trainer_state.pt").is_file():
        return 0
    path = Path(checkpoint_dir)
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
    if "head" in state:
        drafter.head.load_state_dict(state["head"])
    else:  # a checkpoint from before the head moved into trainer_state.pt
        drafter.head.load_upstream_state_dict(load_file(path / "model.safetensors", device=str(drafter.device)))
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    logger.info("resumed drafter training from %s at step %d", path, state["step"])
    return int(state["step"])

