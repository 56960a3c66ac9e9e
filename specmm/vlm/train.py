"""Online distillation of VisionDrafters: target features, input embeddings and logits are computed on the fly
for each batch (nothing stored per sample), the drafter runs teacher-forced over the same prompt slots it
sees at inference, and each method has its own loss (upstream recipes, vlm.md):

- eagle, msd, flash: SmoothL1(feature) + 0.1 soft-label CE (flash also on its semi-autoregressive levels);
- vispec: stage 1 SmoothL1 + 0.1 (CE + 0.1 rank); stage 2 10 L1(probabilities) + 0.1 rank, averaged over the
  teacher-forced pass and `vispec_unroll_steps` self-fed passes (each reads the previous pass's predicted features);
- dream: 0.2 SmoothL1 + KL + SmoothL1(cross-attention layer output, the target layer of lowest attention
  entropy among the first 40 % of layers, per token).
Stage "text" trains on answers without images; stage "multimodal" with them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specmm.core.eagle_train import EagleTrainConfig, train_head
from specmm.core.target import PrefillOutput, final_norm
from specmm.vlm.ddp import BatchShard, launched_processes, train_data_parallel
from specmm.vlm.drafter import IMAGE_ATTENTION, IMAGE_MASK, VisionDrafter

logger = logging.getLogger(__name__)
STAGES = ("text", "multimodal")


@dataclass
class DrafterTrainConfig(EagleTrainConfig):
    """EAGLE's optimiser settings plus the VLM methods' loss knobs."""

    rank_top_k: int = 10
    dream_mid_fraction: float = 0.4
    vispec_unroll_steps: int = 1  # ViSpec stage 2: self-fed passes averaged with the teacher-forced one (mtp_steps)

    def __post_init__(self):
        if self.vispec_unroll_steps < 0:
            raise ValueError(f"vispec_unroll_steps: expected >= 0, got {self.vispec_unroll_steps}")


@dataclass
class TargetPass:
    """One target forward over a batch, as the drafter's training needs it."""

    features: Tensor  # [B, L, H] last-layer features (final norm output)
    inputs_embeds: Tensor  # [B, L, H] merged input embeddings
    image_mask: Tensor  # [B, L] bool
    mid_features: Tensor | None = None  # [B, L, H] DREAM: per-token lowest-entropy early layer
    image_attention: Tensor | None = None  # [B, L] attention each position receives in the last layer


@torch.no_grad()
def run_target(model: nn.Module, batch: dict[str, Tensor], dream: bool = False, mid_fraction: float = 0.4
               ) -> TargetPass:
    """Forward the target once with hooks on the final norm and the language model's input."""
    captured = {}
    norm = final_norm(model)
    language_model = model.get_decoder()

    def grab_embeds(module, args, kwargs):
        captured["inputs_embeds"] = kwargs["inputs_embeds"]

    hooks = [norm.register_forward_hook(lambda m, a, out: captured.__setitem__("features", out)),
             language_model.register_forward_pre_hook(grab_embeds, with_kwargs=True)]
    backend = model.config._attn_implementation
    try:
        if dream:
            model.set_attn_implementation("eager")
        out = model(**batch, logits_to_keep=1, output_attentions=dream, output_hidden_states=dream)
    finally:
        if dream:
            model.set_attn_implementation(backend)
        for hook in hooks:
            hook.remove()
    image_id = model.config.image_token_id
    result = TargetPass(captured["features"], captured["inputs_embeds"], batch["input_ids"] == image_id)
    if dream:
        result.mid_features = _lowest_entropy_layer(out.hidden_states, out.attentions, mid_fraction)
        keys_valid = batch["attention_mask"].bool()
        last = out.attentions[-1].float().mean(1)  # [B, L, L]
        result.image_attention = (last * keys_valid[:, :, None]).sum(1) / keys_valid.sum(1, keepdim=True)
    return result


def _lowest_entropy_layer(hidden_states, attentions, fraction: float) -> Tensor:
    """[B, L, H]: per token, the hidden state of the layer (1 .. n-2 of the first `fraction` of layers)
    whose attention (mean over heads) has the lowest entropy."""
    count = max(1, int(fraction * len(attentions)))
    candidates = list(range(1, count - 1)) if count >= 3 else list(range(count))  # tiny models: the first layers
    entropies = []
    for layer in candidates:
        probs = attentions[layer].float()  # [B, h, L, L]
        entropies.append(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean(1))  # [B, L]
    best = torch.stack(entropies, 0).argmin(0)  # [B, L]
    stacked = torch.stack([hidden_states[layer + 1] for layer in candidates], 0)  # output of layer `layer`
    index = best[None, :, :, None].expand(1, *best.shape, stacked.shape[-1])
    return stacked.gather(0, index)[0]


def soft_cross_entropy(draft_logits: Tensor, target_logits: Tensor) -> Tensor:
    """[..., V] -> [...]: -sum softmax(target) log_softmax(draft)."""
    return -(target_logits.float().softmax(-1) * draft_logits.float().log_softmax(-1)).sum(-1)


def rank_loss(draft_logits: Tensor, target_logits: Tensor, k: int) -> Tensor:
    """[..., V] -> [...]: Plackett-Luce negative log-likelihood of the target's top-k order under the draft."""
    top = target_logits.topk(min(k, target_logits.shape[-1]), dim=-1).indices
    scores = draft_logits.float().gather(-1, top)  # [..., k] in the target's order
    tail = torch.logcumsumexp(scores.flip(-1), -1).flip(-1)  # log sum over items not yet placed
    return (tail - scores).sum(-1)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1)


def drafter_loss(drafter: VisionDrafter, passed: TargetPass, batch: dict[str, Tensor], stage: str,
                 config: DrafterTrainConfig, shard: BatchShard | None = None) -> tuple[Tensor, dict[str, float]]:
    """Teacher-forced loss of one batch; slot t (f_t, token t+1) predicts f_{t+1}. With `shard` (data-parallel
    training) `batch` is this process's rows of a global batch: the noise and the loss's divisor are the whole
    batch's, so the mean over processes is the one-process loss."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    features = passed.features
    if config.feature_noise:
        uniform = torch.rand_like(features) if shard is None else shard.noise(features)
        noisy = features + (uniform - 0.5) * config.feature_noise
    else:
        noisy = features
    extras = {IMAGE_MASK: passed.image_mask[:, :-1]}
    if passed.image_attention is not None:
        extras[IMAGE_ATTENTION] = passed.image_attention[:, :-1]
    prefill = PrefillOutput(noisy[:, :-1], passed.inputs_embeds[:, :-1], extras)
    out, kept = drafter.teacher_forced(ids, mask, prefill)
    # slots whose next feature is a text position carry the loss
    weight = (kept & ~passed.image_mask[:, 1:] & mask[:, 1:].bool()).float()
    wanted = features[:, 1:]
    predicted = out.last_hidden_state
    lm_head = drafter.lm_head
    with torch.no_grad():
        target_logits = lm_head(wanted)
    logits = lm_head(predicted)
    regression = F.smooth_l1_loss(predicted, wanted, reduction="none").mean(-1)
    ce = soft_cross_entropy(logits, target_logits)
    parts = {}
    method = drafter.method
    if method == "dream":
        mid = F.smooth_l1_loss(out.mid_hidden_state, passed.mid_features[:, :-1], reduction="none").mean(-1)
        kl = ce + (target_logits.float().softmax(-1) * target_logits.float().log_softmax(-1)).sum(-1)
        per_slot = 0.2 * regression + kl + mid
        parts["mid"] = _masked_mean(mid, weight).item()
    elif method == "vispec" and stage == "multimodal":
        per_slot, fed = _vispec_stage2(logits, target_logits, config), predicted
        for _ in range(config.vispec_unroll_steps):  # each pass reads the previous pass's predicted features
            fed = _self_fed(drafter, ids, mask, prefill, fed, kept)
            per_slot = per_slot + _vispec_stage2(lm_head(fed), target_logits, config)
        per_slot = per_slot / (1 + config.vispec_unroll_steps)
    elif method == "vispec":
        per_slot = regression + 0.1 * (ce + 0.1 * rank_loss(logits, target_logits, config.rank_top_k))
    else:
        per_slot = regression + 0.1 * ce
    if method == "flash":
        per_slot = per_slot + _sar_loss(drafter, predicted, features, mask, lm_head)
    loss = _masked_mean(per_slot, weight) if shard is None else (per_slot * weight).sum() / shard.mean_divisor(weight)
    parts.update(regression=_masked_mean(regression, weight).item(), ce=_masked_mean(ce, weight).item())
    with torch.no_grad():
        parts["top1"] = _masked_mean((logits.argmax(-1) == target_logits.argmax(-1)).float(), weight).item()
    return loss, parts


def _vispec_stage2(logits: Tensor, target_logits: Tensor, config: DrafterTrainConfig) -> Tensor:
    l1 = (logits.float().softmax(-1) - target_logits.float().softmax(-1)).abs().sum(-1)
    return 10.0 * l1 + 0.1 * rank_loss(logits, target_logits, config.rank_top_k)


def _self_fed(drafter: VisionDrafter, ids: Tensor, mask: Tensor, prefill: PrefillOutput, predicted: Tensor,
              kept: Tensor) -> Tensor:
    """One unroll: slot t reads the head's own prediction of f_t (slot t-1's output) where slot t-1 ran;
    slot 0 and slots after dropped image slots keep the true feature."""
    truth = prefill.features  # [B, L-1, H]
    own = torch.where(kept[:, :-1, None], predicted[:, :-1], truth[:, 1:])
    fed = PrefillOutput(torch.cat([truth[:, :1], own], 1), prefill.inputs_embeds, prefill.extras)
    return drafter.teacher_forced(ids, mask, fed)[0].last_hidden_state


def _sar_loss(drafter: VisionDrafter, predicted: Tensor, features: Tensor, mask: Tensor, lm_head) -> Tensor:
    """FLASH levels: the projection of slot t's output predicts f_{t+1+i}, i = 1..K."""
    levels = drafter.head.sar(predicted)  # [B, L-1, K, H]
    total = torch.zeros(predicted.shape[:2], device=predicted.device)
    length = features.shape[1]
    for i in range(levels.shape[2]):
        shift = i + 2
        if shift >= length:
            break
        wanted = features[:, shift:]  # f_{t+1+(i+1)} for slots t = 0 .. L-1-shift
        guess = levels[:, : length - shift, i]
        with torch.no_grad():
            target_logits = lm_head(wanted)
        term = F.smooth_l1_loss(guess, wanted, reduction="none").mean(-1) + \
            0.1 * soft_cross_entropy(lm_head(guess), target_logits)
        total[:, : length - shift] += term * mask[:, shift:]
    return total / levels.shape[2]


def train_drafter(target: nn.Module, processor, drafter: VisionDrafter, dataset: Callable[[int], dict] | list,
                  config: DrafterTrainConfig | None = None, *, stage: str = "multimodal",
                  checkpoint_dir: str | Path | None = None, progress: bool = True,
                  on_step: Callable[[int, float, dict], None] | None = None) -> list[float]:
    """Train `drafter` against `target` for `config.steps` steps; returns the loss of each step run here.

    dataset: a function step -> batch (processor outputs: input_ids, attention_mask, pixel_values...), or a
    list of such batches cycled through. With `checkpoint_dir` the head and optimiser are saved every
    `checkpoint_every` steps and a later call resumes. `processor` is kept for API symmetry with the pipeline.
    Under `accelerate launch` with several processes it trains data-parallel (`specmm.vlm.ddp`): each process
    takes its equal share of the rows of every batch, and the run trains what one process trains on whole batches;
    the returned losses are the whole batch's, and `on_step` and the progress bar run on the main process only.
    """
    if stage not in STAGES:
        raise ValueError(f"stage: expected one of {STAGES}, got {stage!r}")
    config = config or DrafterTrainConfig()
    batches = _batch_source(dataset)
    device = next(drafter.head.parameters()).device
    image_token_id = target.config.image_token_id
    target.eval()

    def shard_loss(step: int, shard: BatchShard | None = None) -> tuple[Tensor, dict[str, float]]:
        batch = batches(step)
        if "pixel_values_videos" in batch:  # the training passes mark image spans only
            raise ValueError("dataset: video inputs (pixel_values_videos) are not supported in drafter training; "
                             "train on images (the drafter then compresses video spans as it does images)")
        if stage == "text":  # on the whole batch: its padding width is the one-process width
            batch = without_images(batch, image_token_id)
        if shard is not None:
            batch = shard.take(batch, image_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        passed = run_target(target, batch, dream=drafter.method == "dream", mid_fraction=config.dream_mid_fraction)
        return drafter_loss(drafter, passed, batch, stage, config, shard)

    desc = f"{drafter.method}/{stage}"
    if launched_processes() > 1:
        return train_data_parallel(drafter, shard_loss, config, checkpoint_dir=checkpoint_dir, desc=desc,
                                   progress=progress, on_step=on_step)

    def step_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        loss, parts = shard_loss(step)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"train_drafter: loss is {loss.item()} at step {step}")
        return loss, parts

    return train_head(drafter, step_loss, config, checkpoint_dir=checkpoint_dir, desc=desc, progress=progress,
                      on_step=on_step)


def without_images(batch: dict[str, Tensor], image_token_id: int) -> dict[str, Tensor]:
    """Text stage: the same answers with the image tokens (and image inputs) removed, rows re-padded left."""
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    keep = mask & (ids != image_token_id)  # [B, L]
    width = int(keep.sum(1).max())
    order = torch.sort(keep.to(torch.uint8), dim=1, stable=True).indices[:, -width:]  # kept tokens last
    new_mask = keep.gather(1, order)
    return {"input_ids": torch.where(new_mask, ids.gather(1, order), 0), "attention_mask": new_mask.long()}


def _batch_source(dataset) -> Callable[[int], dict]:
    if callable(dataset):
        return dataset
    items = list(dataset)
    if not items:
        raise ValueError("dataset: no batches")
    return lambda step: items[step % len(items)]


__all__ = ["DrafterTrainConfig", "STAGES", "TargetPass", "drafter_loss", "rank_loss", "run_target", "train_drafter"]


def jsonl_batches(path, processor, prompt: str, batch_size: int) -> Callable[[int], dict]:
    """step -> processor batch from a captions .jsonl ({"image": path, "caption": text} lines; error lines are
    skipped), cycling. Feeding the target's own captions is ViSpec's regeneration."""
    import json as _json

    from PIL import Image

    records = []
    for line in Path(path).read_text().splitlines():
        try:
            item = _json.loads(line)
        except ValueError:
            continue
        if "caption" in item and "image" in item:
            records.append(item)
    if not records:
        raise ValueError(f"--data: {path} has no lines with both image and caption")
    from specmm.vlm.caption import caption_prompt
    from specmm.vlm.pipeline import with_image_token

    rendered = caption_prompt(processor, prompt)  # the format `specmm caption` prompts in: train on the same
    if rendered != prompt:
        text_prompt = rendered
    else:  # no chat template: the instruction after the image token, the caption on the next line
        text_prompt = with_image_token(prompt, processor.image_token) + "\n"
    eos = processor.tokenizer.eos_token or ""

    def batch(step: int) -> dict[str, Tensor]:
        chosen = [records[(step * batch_size + i) % len(records)] for i in range(batch_size)]
        images = [Image.open(r["image"]).convert("RGB") for r in chosen]
        processor.tokenizer.padding_side = "left"
        texts = [f"{text_prompt}{r['caption']}{eos}" for r in chosen]
        enc = processor(images=[[image] for image in images], text=texts,  # nested: one image per prompt
                        return_tensors="pt", padding=True)
        return dict(enc)

    return batch
