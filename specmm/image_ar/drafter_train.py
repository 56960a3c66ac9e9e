"""Training the image drafter on the target's own features (both guidance halves), EAGLE-1 style.

Loss = SmoothL1(predicted feature, target feature) + ce_weight * CE(target soft labels, drafter logits),
with uniform noise on the input features, as LANTERN trains its drafter.

Any image model `ImageSampler` serves (LlamaGen, Janus-Pro, Emu3, ...) in one call, on images it samples itself:

    from specmm.image_ar.drafter_train import DrafterTrainConfig, train_image_drafter
    drafter = train_image_drafter(model, prompts, processor, cfg_scale=5.0, temperature=1.0, top_k=4096,
                                  config=DrafterTrainConfig(steps=2000))
    drafter.save_pretrained("drafter/")  # then `make_sampler(..., "lantern", drafter)` or `--drafter drafter/`

`sample_training_tokens` draws the images (plain decoding, seeded per row), and `train_drafter(..., model=...)`
trains on them: the target features come teacher-forced through the model's adapter
(`teacher_forced_features`: the guided target's own prefill and verify, the features the drafter reads
while sampling). Without `model`, `train_drafter(drafter, codes, labels)` trains a LlamaGen drafter on class ids
through the GPT's teacher-forced forward, as it always has.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from specmm.image_ar.drafter import ImageDrafter
from specmm.image_ar.llamagen.gpt import LlamaGenGPT
from specmm.image_ar.models import ImageModel, image_model_for, teacher_forced_features
from specmm.jobs.atomic import atomic_writer


@dataclass
class DrafterTrainConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    ce_weight: float = 0.1
    feature_noise: float = 0.2
    uncond_fraction: float = 0.5  # share of rows trained on the null condition (the uncond half)
    grad_clip: float = 0.5


def head_loss(drafter: ImageDrafter, features: Tensor, tokens: Tensor, ce_weight: float = 0.1,
              feature_noise: float = 0.0, generator: torch.Generator | None = None,
              logits: Tensor | None = None) -> tuple[Tensor, dict]:
    """The head's teacher-forced loss on target features [R, N, d] of image tokens [R, N] (feature i predicts
    token i); `logits`: the target's own [R, N, V] (default: the drafter's output head on the features)."""
    lm, head = drafter.gpt, drafter.head
    if logits is None:
        with torch.no_grad():
            logits = lm.logits(features)
    inputs = features[:, :-1]
    if feature_noise > 0:
        noise = torch.rand(inputs.shape, generator=generator).to(inputs.device) - 0.5
        inputs = inputs + noise * feature_noise
    cells = torch.arange(tokens.shape[1] - 1, device=tokens.device).expand(tokens.shape[0], -1)
    predicted = head(lm.tok_embeddings(tokens[:, :-1]).detach(), inputs, cells, None)  # [R, N-1, d]
    feature_loss = F.smooth_l1_loss(predicted, features[:, 1:])
    soft = logits[:, 1:].softmax(-1)
    ce = -(soft * lm.logits(predicted).log_softmax(-1)).sum(-1).mean()
    with torch.no_grad():
        top1 = (lm.logits(predicted).argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    return feature_loss + ce_weight * ce, {"feature": float(feature_loss.detach()), "ce": float(ce.detach()),
                                           "top1": float(top1)}


def drafter_loss(drafter: ImageDrafter, conditions: Tensor, tokens: Tensor, ce_weight: float = 0.1,
                 feature_noise: float = 0.0, generator: torch.Generator | None = None) -> tuple[Tensor, dict]:
    """Teacher-forced loss of a LlamaGen drafter on image tokens [B, N] under conditions [B] (class ids, null ids
    allowed)."""
    with torch.no_grad():
        logits, features = drafter.gpt(conditions, tokens, return_features=True)  # [B, N, V], [B, N, d]
    return head_loss(drafter, features, tokens, ce_weight, feature_noise, generator, logits)


def model_drafter_loss(model: ImageModel, drafter: ImageDrafter, conditions, tokens: Tensor, uncond: Tensor,
                       cfg_scale: float = 1.0, ce_weight: float = 0.1, feature_noise: float = 0.0,
                       generator: torch.Generator | None = None,
                       caption_mask: Tensor | None = None) -> tuple[Tensor, dict]:
    """Teacher-forced loss through an image model's adapter: row b of tokens [B, N] under its condition, on the
    uncond half's features where uncond[b] (cfg_scale > 1 only), else on the cond half's."""
    features = teacher_forced_features(model, conditions, tokens, cfg_scale, caption_mask)  # [R, N, d]
    batch = tokens.shape[0]
    rows = torch.arange(batch, device=features.device)
    if features.shape[0] == 2 * batch:
        rows = torch.where(uncond.to(features.device), rows + batch, rows)
    return head_loss(drafter, features[rows], tokens.to(features.device), ce_weight, feature_noise, generator)


def train_drafter(drafter: ImageDrafter, codes: Tensor, labels, config: DrafterTrainConfig | None = None,
                  seed: int = 0, progress: bool = True, start_step: int = 0, optimizer=None,
                  on_step=None, *, model: Any = None, cfg_scale: float = 1.0,
                  caption_mask: Tensor | None = None) -> Iterator[dict]:
    """Train on (codes [M, N], labels); yields metrics per step.

    Without `model`: a LlamaGen drafter, labels [M] class ids; null-class rows train the uncond half. With `model`
    (a LlamaGen, an `ImageModel`, or a stock generator `ImageSampler.for_model` serves): labels are row m's
    conditions (text prompts, prompt ids [M, L] with `caption_mask`, class ids), the features come through the
    model's adapter, and with cfg_scale > 1 a share `uncond_fraction` of rows trains the uncond half."""
    config = config or DrafterTrainConfig()
    image_model = None if model is None else image_model_for(model)
    if image_model is None and not isinstance(drafter.gpt, LlamaGenGPT):
        raise ValueError(f"model: a drafter over {type(drafter.gpt).__name__} trains through its image model; "
                         "pass model= (the generator it drafts for)")
    if image_model is not None:
        check_training_set(image_model, codes, labels, caption_mask)
    gen = torch.Generator().manual_seed(seed)
    model_grads = [(p, p.requires_grad) for p in drafter.gpt.parameters()]  # the user's model: restored at the end
    for p, _ in model_grads:
        p.requires_grad_(False)
    try:
        drafter.head.train()
        optimizer = optimizer or torch.optim.AdamW(drafter.head.parameters(), lr=config.lr, betas=(0.9, 0.95))
        bar = tqdm(range(start_step, config.steps), disable=not progress, desc="image drafter")
        for step in bar:
            gen.manual_seed(seed * 100003 + step)  # resumable: each step's batch depends only on the step
            index = torch.randint(len(codes), (config.batch_size,), generator=gen)
            drop = torch.rand(config.batch_size, generator=gen) < config.uncond_fraction
            if image_model is None:
                conditions = labels[index].clone()
                if drafter.gpt.config.has_null_class:
                    conditions[drop] = drafter.gpt.config.num_classes
                loss, metrics = drafter_loss(drafter, conditions.to(drafter.device), codes[index].to(drafter.device),
                                             config.ce_weight, config.feature_noise, gen)
            else:
                loss, metrics = model_drafter_loss(image_model, drafter, take_rows(labels, index), codes[index], drop,
                                                   cfg_scale, config.ce_weight, config.feature_noise, gen,
                                                   take_rows(caption_mask, index))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.head.parameters(), config.grad_clip)
            optimizer.step()
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{metrics['top1']:.2f}")
            if on_step is not None:
                on_step(step, optimizer)
            yield {"step": step, "loss": float(loss.detach()), **metrics}
        drafter.head.eval()
    finally:
        for p, wanted in model_grads:
            p.requires_grad_(wanted)


def take_rows(conditions, index: Tensor):
    """Rows `index` of conditions: a list of prompts, a tensor, or a mapping of tensors (processor output)."""
    if conditions is None:
        return None
    if isinstance(conditions, Tensor):
        return conditions[index.to(conditions.device)]
    if isinstance(conditions, Mapping):
        return {key: take_rows(value, index) for key, value in conditions.items()}
    return [conditions[i] for i in index.tolist()]


def count_rows(conditions) -> int:
    if isinstance(conditions, str):
        raise ValueError("prompts: expected a list of prompts (one per row), got a single string")
    if isinstance(conditions, Mapping):
        conditions = conditions.get("input_ids")
    if not isinstance(conditions, (Tensor, list, tuple)):
        raise ValueError(f"prompts: expected a list of prompts, a tensor or processor output, got "
                         f"{type(conditions).__name__}")
    return len(conditions)


def check_training_set(model: ImageModel, codes: Tensor, labels, caption_mask: Tensor | None) -> None:
    """ValueError before any work unless codes [M, N] are whole images of the model's codes, one label row each."""
    n, vocab = model.tokens_per_image, model.target.vocab_size
    if not isinstance(codes, Tensor) or codes.dim() != 2 or codes.shape[1] != n or codes.shape[0] == 0:
        shape = tuple(codes.shape) if isinstance(codes, Tensor) else type(codes).__name__
        raise ValueError(f"codes: expected image tokens [M, {n}], got {shape}")
    if int(codes.min()) < 0 or int(codes.max()) >= vocab:
        raise ValueError(f"codes: image tokens must be in [0, {vocab})")
    if count_rows(labels) != codes.shape[0]:
        raise ValueError(f"labels: {count_rows(labels)} conditions for {codes.shape[0]} images")
    if caption_mask is not None and caption_mask.shape[0] != codes.shape[0]:
        raise ValueError(f"caption_mask: {caption_mask.shape[0]} rows for {codes.shape[0]} images")


@torch.no_grad()
def sample_training_tokens(model: Any, prompts, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
                           top_p: float = 1.0, batch_size: int = 8, seed: int = 0,
                           caption_mask: Tensor | None = None, first_row: int = 0) -> Tensor:
    """The model's own images for drafter training: image tokens [M, N], one per prompt, by plain decoding
    (`ImageSampler(proposer="ar")`), row m drawn with its own generator (seed, first_row + m): batching, and
    sampling a set in slices (`first_row` = the slice's start), change nothing."""
    from specmm.image_ar.sampler import ImageSampler

    model = image_model_for(model)
    rows = count_rows(prompts)
    if rows == 0 or batch_size < 1:
        raise ValueError(f"prompts / batch_size: expected at least one prompt and batch_size >= 1, got {rows} and "
                         f"{batch_size}")
    sampler = ImageSampler(model, proposer="ar")
    device = model.target.device
    chunks = []
    for start in range(0, rows, batch_size):
        index = torch.arange(start, min(rows, start + batch_size))
        gens = [torch.Generator(device).manual_seed(seed * 1000003 + first_row + int(m)) for m in index]
        out = sampler.sample(take_rows(prompts, index), cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
                             top_p=top_p, generator=gens, caption_mask=take_rows(caption_mask, index), decode=False)
        chunks.append(out.tokens.cpu())
    return torch.cat(chunks)


def train_image_drafter(model: Any, prompts, processor: Any = None, *, cfg_scale: float = 1.0,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, images_per_prompt: int = 1,
                        config: DrafterTrainConfig | None = None, seed: int = 0, caption_mask: Tensor | None = None,
                        drafter: ImageDrafter | None = None, progress: bool = True,
                        checkpoint_dir: str | Path | None = None, checkpoint_every: int = 200,
                        sample_batch_size: int = 8) -> ImageDrafter:
    """An `ImageDrafter` for `model` (a stock generator with its processor, an `ImageModel`, or a LlamaGen) trained
    on `images_per_prompt` images it samples itself per prompt (at the given guidance and sampling settings), the
    head seeded by `seed` (or `drafter` trained further).

    With `checkpoint_dir` the run is resumable: the sampled images are kept there a slice of `sample_batch_size`
    at a time, and the head with its optimizer every `checkpoint_every` steps (each file written atomically); a
    rerun with the same arguments picks up where the last stopped and ends with the same drafter."""
    if isinstance(images_per_prompt, bool) or not isinstance(images_per_prompt, int) or images_per_prompt < 1:
        raise ValueError(f"images_per_prompt: expected an integer >= 1, got {images_per_prompt!r}")
    for name, value in (("checkpoint_every", checkpoint_every), ("sample_batch_size", sample_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    config = config or DrafterTrainConfig()
    image_model = image_model_for(model, processor)
    repeat = torch.arange(count_rows(prompts)).repeat_interleave(images_per_prompt)
    prompts, caption_mask = take_rows(prompts, repeat), take_rows(caption_mask, repeat)
    folder = None if checkpoint_dir is None else Path(checkpoint_dir)
    sampling = dict(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    codes = _training_codes(image_model, prompts, caption_mask, sampling, sample_batch_size, folder, progress)
    if drafter is None:
        torch.manual_seed(seed)
        drafter = ImageDrafter.for_target(image_model.lm)
    optimizer, start = None, 0
    run = {"config": asdict(config), "seed": seed, "images": len(codes), **sampling}  # what a checkpoint must match
    checkpoint = None if folder is None else folder / "drafter.pt"
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location=drafter.device, weights_only=True)
        if state["run"] != run:
            raise ValueError(f"checkpoint_dir: {checkpoint} is from a run with other settings ({state['run']}); "
                             "resume it with its own, or use another folder")
        drafter.head.load_state_dict(state["head"])
        optimizer = torch.optim.AdamW(drafter.head.parameters(), lr=config.lr, betas=(0.9, 0.95))
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1

    def save_checkpoint(step: int, optimizer) -> None:
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == config.steps):
            with atomic_writer(checkpoint) as f:
                torch.save({"run": run, "step": step, "head": drafter.head.state_dict(),
                            "optimizer": optimizer.state_dict()}, f)

    for _ in train_drafter(drafter, codes, prompts, config, seed, progress, start_step=start, optimizer=optimizer,
                           on_step=save_checkpoint, model=image_model, cfg_scale=cfg_scale,
                           caption_mask=caption_mask):
        pass
    return drafter


def _training_codes(image_model: ImageModel, prompts, caption_mask: Tensor | None, sampling: dict,
                    batch_size: int, folder: Path | None, progress: bool) -> Tensor:
    """`sample_training_tokens` over every prompt row; with `folder`, one file per slice of `batch_size` rows
    (codes-START.pt), sampled only where missing."""
    rows = count_rows(prompts)
    if folder is None:
        return sample_training_tokens(image_model, prompts, batch_size=batch_size, caption_mask=caption_mask,
                                      **sampling)
    folder.mkdir(parents=True, exist_ok=True)
    chunks = []
    for start in tqdm(range(0, rows, batch_size), disable=not progress, desc="training images"):
        path = folder / f"codes-{start:06d}.pt"
        if not path.exists():
            index = torch.arange(start, min(rows, start + batch_size))
            tokens = sample_training_tokens(image_model, take_rows(prompts, index), batch_size=batch_size,
                                            caption_mask=take_rows(caption_mask, index), first_row=start, **sampling)
            with atomic_writer(path) as f:
                torch.save(tokens, f)
        chunks.append(torch.load(path, weights_only=True))
    return torch.cat(chunks)
