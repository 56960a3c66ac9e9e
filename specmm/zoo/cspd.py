"""Zoo entry `cspd`: a diffusers AutoencoderKL, a continuous-token AR target and a smaller draft, on the class images.

Pipeline: train the KL autoencoder on the procedural class images, encode them into latent token maps (posterior
means, scaled to unit std: the `scaling_factor` saved in the VAE's config), train the target `ContinuousAR` on
those tokens, then the draft: recipes with `draft_head: "target"` give it a frozen copy of the target's head,
`draft_train` trains it on the data, and `distill_train` distils it towards the target by the trajectory KL (on
which CSpD's acceptance depends), on `distill_samples` target samples when set (the contexts the draft meets at
inference, which a weak target's samples leave far from the data). Last, a small timm classifier (the FID/KID
feature extractor of the benchmark).
Every stage resumes from its checkpoint; batches and noise are pure functions of (seed, step).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from torch import Tensor

from specmm.image_ar.continuous import (
    ContinuousAR,
    ContinuousARConfig,
    CSpDSampler,
    sample_ar,
)
from specmm.image_ar.continuous.distill import trajectory_kl_loss
from specmm.image_ar.continuous.latents import decode, encode
from specmm.image_ar.continuous.metrics import ImageFeatures, to_unit_range
from specmm.jobs import atomic_writer
from specmm.zoo.class_images import CLASSES, class_dataset
from specmm.zoo.lm_training import GPU_TRAINING_EAGER, LMTrainConfig, train_causal_lm

logger = logging.getLogger(__name__)


def _train(steps, batch_size, lr, warmup=20, every=50, **gpu) -> dict:
    return {"steps": steps, "batch_size": batch_size, "lr": lr, "warmup_steps": warmup, "checkpoint_every": every,
            **gpu}


RECIPES = {
    "tiny": {  # seconds: tests of the recipe machinery
        "image_size": 16, "per_class": 4, "heldout_per_class": 2, "kl_weight": 1e-5, "head_repeats": 2,
        "vae": {"block_out_channels": [8, 8, 8], "latent_channels": 2, "norm_num_groups": 4},
        "target": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "head_width": 16, "head_depth": 1,
                   "diffusion_steps": 2},
        "draft": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "head_width": 16, "head_depth": 1,
                  "diffusion_steps": 2},
        "draft_head": "target", "distill_samples": 6,
        "vae_train": _train(3, 4, 1e-3, 1, 2), "target_train": _train(3, 4, 1e-3, 1, 2),
        "draft_train": _train(3, 4, 1e-3, 1, 2), "classifier_train": _train(3, 8, 1e-3, 1, 2),
        "distill_train": _train(2, 4, 1e-3, 1, 2),
        "classifier": "test_resnet", "eval_images": 4,
    },
    "cpu": {  # about 11 minutes on two idle CPU cores: 16 px images -> 4x4 latent tokens of 4 channels
        # A deep narrow target (per-token latency on a CPU grows with depth, not width: 64 layers give a
        # target/draft latency ratio like that of real pairs) and a 2-layer draft that shares the target's frozen
        # head, distilled on target samples.
        "image_size": 16, "per_class": 150, "heldout_per_class": 20, "kl_weight": 1e-5, "head_repeats": 4,
        "vae": {"block_out_channels": [16, 32, 64], "latent_channels": 4, "norm_num_groups": 8},
        "target": {"hidden_size": 64, "num_layers": 64, "num_heads": 4, "head_width": 128, "head_depth": 3,
                   "diffusion_steps": 4},
        "draft": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "head_width": 128, "head_depth": 3,
                  "diffusion_steps": 4},
        "draft_head": "target", "distill_samples": 3000,
        "vae_train": _train(400, 32, 2e-3), "target_train": _train(1000, 32, 1e-3, 100),
        "distill_train": _train(3000, 32, 2e-3), "classifier_train": _train(150, 64, 2e-3),
        "classifier": "test_resnet", "eval_images": 20,
    },
    # the `cspd` step on one H100 (untested: no GPU run yet): 64 px -> 8x8 tokens of 8 channels. Target ~90M params
    # (12 layers, 768 wide, + its denoising head), 4000 steps x 128 images x 64 tokens x 4 head repeats: ~2e15 FLOPs
    # for the backbone, the DDPM heads a few times more: ~1.5 min; VAE 2000 steps of 64 images ~1 min; classifier and
    # draft ~1.5 min; bf16 autocast + fused AdamW, eager (diffusers' VAE and the head loss draw from a generator).
    "gpu": {
        "image_size": 64, "per_class": 1000, "heldout_per_class": 50, "kl_weight": 1e-5, "head_repeats": 4,
        "vae": {"block_out_channels": [64, 128, 256, 256], "latent_channels": 8, "norm_num_groups": 32},
        "target": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "head_width": 1024, "head_depth": 6,
                   "diffusion_steps": 8},
        "draft": {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "head_width": 256, "head_depth": 2,
                  "diffusion_steps": 8},
        "vae_train": _train(2000, 64, 1e-3, 100, 500, **GPU_TRAINING_EAGER),
        "target_train": _train(4000, 128, 4e-4, 200, 1000, **GPU_TRAINING_EAGER),
        "draft_train": _train(3000, 128, 1e-3, 200, 1000, **GPU_TRAINING_EAGER),
        "classifier_train": _train(1000, 128, 1e-3, 100, 500, **GPU_TRAINING_EAGER),
        "distill_train": _train(2000, 128, 5e-4, 100, 1000, **GPU_TRAINING_EAGER),
        "classifier": "resnet18", "eval_images": 256,
    },
}


def make_vae(recipe: dict, seed: int) -> AutoencoderKL:
    v, blocks = recipe["vae"], len(recipe["vae"]["block_out_channels"])
    torch.manual_seed(seed)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
                         up_block_types=("UpDecoderBlock2D",) * blocks,
                         block_out_channels=tuple(v["block_out_channels"]),
                         layers_per_block=1, latent_channels=v["latent_channels"], norm_num_groups=v["norm_num_groups"],
                         sample_size=recipe["image_size"], mid_block_add_attention=False)


def model_config(recipe: dict, role: str) -> ContinuousARConfig:
    down = 2 ** (len(recipe["vae"]["block_out_channels"]) - 1)
    return ContinuousARConfig(token_dim=recipe["vae"]["latent_channels"], grid=recipe["image_size"] // down,
                              num_classes=len(CLASSES), **recipe[role])


def _config(train: dict, seed: int) -> LMTrainConfig:
    return LMTrainConfig(seq_len=0, seed=seed, **train)


def _batches(data: dict[str, Tensor], config: LMTrainConfig):
    """Random rows of `data` per step, plus the step's own noise seed; a pure function of (seed, step)."""
    count = next(iter(data.values())).shape[0]

    def make_batch(step: int) -> dict[str, Tensor]:
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        rows = torch.randint(0, count, (config.batch_size,), generator=gen)
        return {**{k: v[rows] for k, v in data.items()}, "seed": torch.randint(0, 2**62, (1,), generator=gen)}

    return make_batch


def _generator(batch: dict[str, Tensor], device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(batch["seed"]))


def vae_loss(kl_weight: float):
    def loss(vae: AutoencoderKL, batch: dict[str, Tensor]) -> Tensor:
        images = batch["images"]
        posterior = vae.encode(images).latent_dist
        recon = vae.decode(posterior.sample(generator=_generator(batch, images.device))).sample
        return F.mse_loss(recon, images) + kl_weight * posterior.kl().mean()
    return loss


def ar_loss(head_repeats: int):
    def loss(model: ContinuousAR, batch: dict[str, Tensor]) -> Tensor:
        latents = batch["latents"]
        return model.loss(latents, batch["labels"], _generator(batch, latents.device), head_repeats)
    return loss


def distill_loss(target: ContinuousAR, head_repeats: int):
    def loss(draft: ContinuousAR, batch: dict[str, Tensor]) -> Tensor:
        latents = batch["latents"]
        return trajectory_kl_loss(draft, target, latents, batch["labels"], _generator(batch, latents.device),
                                  head_repeats)
    return loss


def classifier_loss(model: ImageFeatures, batch: dict[str, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch["images"]), batch["labels"])


def share_head(draft: ContinuousAR, target: ContinuousAR) -> None:
    """Give the draft a frozen copy of the target's denoising head, so training (distillation) only has to match
    the target's feature z; the draft's hidden size must equal the target's and its head the target's shape."""
    try:
        draft.head.load_state_dict(target.head.state_dict())
    except RuntimeError as error:  # missing keys or size mismatches
        raise ValueError("draft_head: 'target' needs the draft's hidden_size, head_width and head_depth equal to "
                         "the target's") from error
    draft.head.requires_grad_(False)


@torch.no_grad()
def target_samples(target: ContinuousAR, count: int, path: Path, seed: int, batch_size: int = 250) -> dict[str, Tensor]:
    """`count` class-balanced target-only samples {"latents", "labels"}, kept at `path` so a resumed build reuses them.

    A draft distilled on data learns contexts the target seldom produces; on these it learns the target's own.
    """
    if path.is_file():
        return torch.load(path)
    labels = torch.arange(count) % len(CLASSES)
    gen = torch.Generator().manual_seed(seed + 5)
    latents = torch.cat([sample_ar(target.eval(), chunk, generator=gen).tokens for chunk in labels.split(batch_size)])
    samples = {"latents": latents, "labels": labels}
    with atomic_writer(path) as f:  # a cache a killed build may resume from: whole or absent
        torch.save(samples, f)
    return samples


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Build the entry into `dest` (checkpoints in dest/work); returns the zoo.json record."""
    work = dest / "work"
    images, labels = class_dataset(recipe["per_class"], recipe["image_size"], seed=0)
    held_images, held_labels = class_dataset(recipe["heldout_per_class"], recipe["image_size"], seed=1)
    record: dict = {"images": {"train": len(labels), "heldout": len(held_labels), "size": recipe["image_size"]}}

    vae = make_vae(recipe, seed)
    config = _config(recipe["vae_train"], seed)
    losses = train_causal_lm(vae, _batches({"images": to_unit_range(images)}, config), config, work / "vae",
                             desc="cspd/vae", progress=progress, loss_fn=vae_loss(recipe["kl_weight"]))
    tokens = encode(vae, images)
    scale = float(1.0 / tokens.std())
    vae.register_to_config(scaling_factor=scale)
    vae.save_pretrained(dest / "vae")
    held_tokens = encode(vae, held_images)
    recon = decode(vae, held_tokens * scale)
    record["vae"] = {"final_train_loss": sum(losses[-10:]) / len(losses[-10:]), "scaling_factor": scale,
                     "heldout_recon_mse": float(F.mse_loss(to_unit_range(recon), to_unit_range(held_images))),
                     "parameters": sum(p.numel() for p in vae.parameters())}

    data, held = {"latents": tokens * scale, "labels": labels}, held_tokens * scale
    models = {}
    for offset, role in enumerate(("target", "draft"), start=1):
        torch.manual_seed(seed + offset)
        model = ContinuousAR(model_config(recipe, role))
        if role == "draft" and recipe.get("draft_head") == "target":
            share_head(model, models["target"])
        if recipe.get(f"{role}_train"):
            config = _config(recipe[f"{role}_train"], seed + offset)
            losses = train_causal_lm(model, _batches(data, config), config, work / role, desc=f"cspd/{role}",
                                     progress=progress, loss_fn=ar_loss(recipe["head_repeats"]))
        if role == "draft" and recipe.get("distill_train"):  # then match the target's denoising (trajectory KL)
            contexts = data
            if recipe.get("distill_samples"):  # on the target's own samples: the contexts the draft meets in CSpD
                contexts = target_samples(models["target"], recipe["distill_samples"], work / "target_samples.pt",
                                          seed)
                record["distill_samples"] = recipe["distill_samples"]
            config = _config(recipe["distill_train"], seed + 4)
            losses = train_causal_lm(model, _batches(contexts, config), config, work / "distill", desc="cspd/distill",
                                     progress=progress, loss_fn=distill_loss(models["target"], recipe["head_repeats"]))
        model.save_pretrained(dest / role)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(seed)
            heldout = float(model.loss(held, held_labels, gen, head_repeats=8))
        models[role] = model.eval()
        record[role] = {"parameters": sum(p.numel() for p in model.parameters()), "steps": config.steps,
                        "final_train_loss": sum(losses[-10:]) / len(losses[-10:]), "heldout_loss": heldout}

    torch.manual_seed(seed + 3)
    classifier = ImageFeatures(recipe["classifier"], len(CLASSES))
    config = _config(recipe["classifier_train"], seed + 3)
    train_causal_lm(classifier, _batches({"images": to_unit_range(images), "labels": labels}, config), config,
                    work / "classifier", desc="cspd/classifier", progress=progress, loss_fn=classifier_loss)
    classifier.eval().save_pretrained(dest / "classifier")
    record["classifier"] = {"model": recipe["classifier"],
                            "heldout_accuracy": float((classifier.predict(held_images) == held_labels).float().mean())}

    count = recipe["eval_images"]
    eval_labels = torch.arange(count) % len(CLASSES)
    generated = sample_ar(models["target"], eval_labels, generator=torch.Generator().manual_seed(seed))
    spec = CSpDSampler(models["target"], models["draft"], draft_tokens=4).sample(
        eval_labels, generator=torch.Generator().manual_seed(seed))
    record["eval"] = {"images": count,
                      "target_class_accuracy": float((classifier.predict(decode(vae, generated.tokens))
                                                      == eval_labels).float().mean()),
                      "cspd_mean_accepted": spec.stats.mean_accepted,
                      "cspd_acceptance_rate": spec.stats.continuous.acceptance_rate}
    return record


def load(folder: str | Path, device: torch.device | str = "cpu") -> dict:
    """The built entry: {"vae", "target", "draft", "classifier"}, in eval mode on `device`."""
    folder = Path(folder)
    return {"vae": AutoencoderKL.from_pretrained(folder / "vae").to(device).eval(),
            "target": ContinuousAR.from_pretrained(folder / "target", device),
            "draft": ContinuousAR.from_pretrained(folder / "draft", device),
            "classifier": ImageFeatures.from_pretrained(folder / "classifier", device)}


__all__ = ["RECIPES", "build", "load", "model_config", "share_head", "target_samples"]
