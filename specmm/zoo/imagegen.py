"""Zoo entry `imagegen`: a class-conditional LlamaGen trained here on the procedural image classes.

Four stages, each resumable from `work/` checkpoints: a LlamaGen-layout VQ tokenizer on the class images,
a class-conditional LlamaGen GPT on their codes, the EAGLE-style image drafter on the GPT's features, and a
small timm classifier (the feature extractor for FID/KID, and the class-accuracy judge). Artifacts are
saved in the upstream checkpoint layout (`{"model": state_dict}` .pt + JSON configs), so they load with
`LlamaGen.from_checkpoint` like released LlamaGen weights.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from specmm.jobs import atomic_writer
from specmm.zoo.class_images import CLASSES, class_dataset

logger = logging.getLogger(__name__)

RECIPES = {
    "tiny": {"image_size": 16, "per_class": 3, "heldout_per_class": 1,
             "vq": {"codebook_size": 32, "codebook_embed_dim": 8, "ch": 32, "ch_mult": [1, 2], "z_channels": 32,
                    "num_res_blocks": 1},
             "gpt": {"dim": 32, "n_layer": 1, "n_head": 2},
             "vq_train": {"steps": 3, "batch_size": 8, "lr": 2e-3},
             "gpt_train": {"steps": 3, "batch_size": 8, "lr": 2e-3},
             "drafter_train": {"steps": 2, "batch_size": 4, "lr": 2e-3},
             "classifier": {"model": "test_resnet", "steps": 2, "batch_size": 8, "lr": 2e-3},
             "checkpoint_every": 2},
    # <= 6 minutes on 2 idle CPU cores: 32 px images, 4x downsampling -> 8x8 = 64 tokens, 256 codes
    "cpu": {"image_size": 32, "per_class": 160, "heldout_per_class": 20,
            "vq": {"codebook_size": 256, "codebook_embed_dim": 8, "ch": 32, "ch_mult": [1, 2, 2], "z_channels": 32,
                   "num_res_blocks": 1},
            "gpt": {"dim": 128, "n_layer": 4, "n_head": 4},
            "vq_train": {"steps": 250, "batch_size": 16, "lr": 2e-3},
            "gpt_train": {"steps": 350, "batch_size": 32, "lr": 2e-3},
            "drafter_train": {"steps": 200, "batch_size": 16, "lr": 2e-3},
            "classifier": {"model": "resnet10t", "steps": 80, "batch_size": 64, "lr": 2e-3},
            "checkpoint_every": 50},
    # for the GPU benchmarks (untested here): 64 px, 8x downsampling -> 8x8 tokens, GPT-B-like width; every stage
    # trains on CUDA under bf16 autocast (weights and optimiser in fp32, fused AdamW)
    "gpu": {"device": "cuda", "precision": "bfloat16", "image_size": 64, "per_class": 2000, "heldout_per_class": 100,
            "vq": {"codebook_size": 1024, "codebook_embed_dim": 8, "ch": 64, "ch_mult": [1, 1, 2, 2],
                   "z_channels": 64, "num_res_blocks": 2},
            "gpt": {"dim": 512, "n_layer": 8, "n_head": 8},
            "vq_train": {"steps": 6000, "batch_size": 64, "lr": 1e-3},
            "gpt_train": {"steps": 10000, "batch_size": 64, "lr": 1e-3},
            "drafter_train": {"steps": 4000, "batch_size": 64, "lr": 1e-3},
            "classifier": {"model": "resnet18", "steps": 2000, "batch_size": 128, "lr": 1e-3},
            "checkpoint_every": 500},
}
# `cpu` with a 12-layer GPT (LlamaGen-B's depth): the one-layer drafter then costs about a twelfth of a target step,
# as LANTERN's drafter does against LlamaGen's 12-36 layers, not the quarter it costs against the 4-layer `cpu` GPT
RECIPES["cpu-deep"] = {**copy.deepcopy(RECIPES["cpu"]), "gpt": {"dim": 128, "n_layer": 12, "n_head": 4}}


def _resumable(name: str, work: Path, module: nn.Module, steps: int, lr: float, loss_fn: Callable[[int], Tensor],
               checkpoint_every: int, progress: bool, params=None, precision: str = "float32") -> list[float]:
    """AdamW + cosine schedule on the module's device (fused on CUDA; the loss under bf16 autocast when `precision`
    is "bfloat16"); checkpoints {model, optimizer, step, losses} to work/<name>.pt."""
    params = list(params if params is not None else module.parameters())
    device = params[0].device
    fused = {"fused": True} if device.type == "cuda" else {}  # absent on the CPU: the same optimiser as before
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0, **fused)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    path, start, losses = work / f"{name}.pt", 0, []
    if path.is_file():
        state = torch.load(path, weights_only=True, map_location=device)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start, losses = state["step"], state["losses"]
    module.train()
    for step in tqdm(range(start, steps), disable=not progress, desc=f"imagegen/{name}", initial=start, total=steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            loss = loss_fn(step)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            with atomic_writer(path) as f:  # a kill never leaves half a checkpoint
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                            "schedule": schedule.state_dict(), "step": step + 1, "losses": losses}, f)
    module.eval()
    return losses


def _batch(n: int, size: int, step: int, seed: int) -> Tensor:
    return torch.randint(n, (size,), generator=torch.Generator().manual_seed(seed * 7919 + step))


def vq_loss(vq, images: Tensor, beta: float = 0.25) -> Tensor:
    """Reconstruction MSE + codebook and commitment losses on L2-normalised latents (LlamaGen's VQ objective)."""
    latent = vq.encode_latent(images)
    z = F.normalize(latent, dim=1)
    codes = vq.quantize.nearest(latent)
    z_q = vq.quantize.lookup(codes, latent.shape[2], latent.shape[3])
    reconstruction = vq.decode_latent(z + (z_q - z).detach())
    return F.mse_loss(reconstruction, images) + F.mse_loss(z_q, z.detach()) + beta * F.mse_loss(z, z_q.detach())


def _pixels(images: Tensor) -> Tensor:
    return images.float() / 127.5 - 1.0


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Train the four stages into `dest` (checkpoints in dest/work) and return the zoo.json record. Training runs on
    the recipe's `device` (default the CPU) with its `precision`; the artifacts are saved from the CPU."""
    import timm

    from specmm.image_ar import ImageDrafter, LlamaGen
    from specmm.image_ar.drafter_train import DrafterTrainConfig, drafter_loss
    from specmm.zoo import training_device

    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    size, every = recipe["image_size"], recipe["checkpoint_every"]
    device, precision = training_device(recipe), recipe.get("precision", "float32")
    images, labels = class_dataset(recipe["per_class"], size, seed)
    held_images, held_labels = class_dataset(recipe["heldout_per_class"], size, seed + 1)
    images, labels = images.to(device), labels.to(device)
    held_pixels, held_on_device = _pixels(held_images).to(device), held_labels.to(device)
    pixels = _pixels(images)
    n = len(images)
    vq_cfg = recipe["vq"]
    grid = size // 2 ** (len(vq_cfg["ch_mult"]) - 1)
    gpt_cfg = {**recipe["gpt"], "vocab_size": vq_cfg["codebook_size"], "block_size": grid * grid,
               "num_classes": len(CLASSES), "model_type": "c2i", "class_dropout_prob": 0.1, "cls_token_num": 1}
    torch.manual_seed(seed)
    lg = LlamaGen.from_config(gpt_cfg, vq_cfg, image_size=size).to(device)  # initialised on the CPU: same weights

    # 1. VQ tokenizer; codebook initialised from encoder latents so no code starts dead
    with torch.no_grad():
        latents = F.normalize(lg.vq.encode_latent(pixels[_batch(n, 64, -1, seed)]), dim=1)
        flat = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
        lg.vq.quantize.embedding.weight.copy_(flat[torch.randperm(len(flat))[: vq_cfg["codebook_size"]]])
    vt = recipe["vq_train"]
    vq_losses = _resumable("vq", work, lg.vq, vt["steps"], vt["lr"],
                           lambda s: vq_loss(lg.vq, pixels[_batch(n, vt["batch_size"], s, seed)]), every, progress,
                           precision=precision)
    with torch.no_grad():
        codes = torch.cat([lg.vq.encode(chunk) for chunk in pixels.split(256)])  # [N, grid^2]
        held_rec = torch.cat([lg.vq(chunk)[0] for chunk in held_pixels.split(256)])
    used = int(codes.unique().numel())

    # 2. class-conditional GPT with 10 % null-class dropout (for guidance)
    gt = recipe["gpt_train"]

    def gpt_loss(step: int) -> Tensor:
        index = _batch(n, gt["batch_size"], step, seed + 1)
        cond = labels[index].clone()
        cond[(torch.rand(len(index), generator=torch.Generator().manual_seed(step)) < 0.1).to(device)] = len(CLASSES)
        logits = lg.gpt(cond, codes[index])
        return F.cross_entropy(logits.flatten(0, 1), codes[index].flatten())

    gpt_losses = _resumable("gpt", work, lg.gpt, gt["steps"], gt["lr"], gpt_loss, every, progress, precision=precision)
    with torch.no_grad():
        held_codes = lg.vq.encode(held_pixels)
        held_loss = float(F.cross_entropy(lg.gpt(held_on_device, held_codes).flatten(0, 1), held_codes.flatten()))

    # 3. EAGLE-style drafter on the GPT's features (both guidance halves)
    dt = recipe["drafter_train"]
    drafter = ImageDrafter.for_target(lg.gpt)
    for p in lg.gpt.parameters():
        p.requires_grad_(False)

    def head_loss(step: int) -> Tensor:
        index = _batch(n, dt["batch_size"], step, seed + 2)
        cond = labels[index].clone()
        cond[(torch.rand(len(index), generator=torch.Generator().manual_seed(step)) < 0.5).to(device)] = len(CLASSES)
        return drafter_loss(drafter, cond, codes[index], 0.1, 0.2, torch.Generator().manual_seed(step))[0]

    cfg = DrafterTrainConfig(steps=dt["steps"], batch_size=dt["batch_size"], lr=dt["lr"])
    drafter_losses = _resumable("drafter", work, drafter.head, cfg.steps, cfg.lr, head_loss, every, progress,
                                precision=precision)
    with torch.no_grad():
        top1 = drafter_loss(drafter, held_on_device, held_codes)[1]["top1"]

    # 4. timm classifier on the real images (FID/KID features and class accuracy)
    ct = recipe["classifier"]
    torch.manual_seed(seed + 3)
    classifier = timm.create_model(ct["model"], num_classes=len(CLASSES), pretrained=False).to(device)
    from specmm.image_ar.metrics import TimmFeatures, accuracy

    judge = TimmFeatures(classifier)
    mean, std = judge.mean.to(device), judge.std.to(device)

    def classifier_loss(step: int) -> Tensor:
        index = _batch(n, ct["batch_size"], step, seed + 3)
        x = (images[index].float() / 255.0 - mean) / std
        return F.cross_entropy(classifier(x), labels[index])

    classifier_losses = _resumable("classifier", work, classifier, ct["steps"], ct["lr"], classifier_loss, every,
                                   progress, precision=precision)
    held_accuracy = accuracy(judge(held_images)[1], held_labels)
    lg.cpu(), drafter.head.cpu(), classifier.cpu()

    # artifacts in upstream layout
    torch.save({"model": lg.gpt.state_dict()}, dest / "gpt.pt")
    torch.save({"model": lg.vq.state_dict()}, dest / "vq.pt")
    (dest / "gpt_config.json").write_text(json.dumps(lg.gpt.config.to_dict(), indent=1))
    (dest / "vq_config.json").write_text(json.dumps(lg.vq.config.to_dict(), indent=1))
    drafter.save_pretrained(dest / "drafter")
    torch.save({"model": classifier.state_dict()}, dest / "classifier.pt")
    (dest / "classifier.json").write_text(json.dumps({"model": ct["model"], "num_classes": len(CLASSES),
                                                      "classes": list(CLASSES), "image_size": size}))

    def tail(xs: list[float]) -> float:
        part = xs[-max(1, len(xs) // 10):]
        return sum(part) / len(part)

    return {"image_size": size, "grid": grid, "tokens_per_image": grid * grid, "classes": list(CLASSES),
            "train_images": n, "heldout_images": len(held_images),
            "vq": {"final_loss": tail(vq_losses), "codes_used": used,
                   "heldout_reconstruction_mse": float(F.mse_loss(held_rec, held_pixels))},
            "gpt": {"parameters": sum(p.numel() for p in lg.gpt.parameters()), "final_loss": tail(gpt_losses),
                    "heldout_loss": held_loss},
            "drafter": {"final_loss": tail(drafter_losses), "heldout_top1_agreement": top1},
            "classifier": {"model": ct["model"], "final_loss": tail(classifier_losses),
                           "heldout_accuracy": held_accuracy}}


@dataclass
class ImageGenModels:
    lg: object  # specmm.image_ar.LlamaGen
    drafter: object  # specmm.image_ar.ImageDrafter
    judge: object  # specmm.image_ar.metrics.TimmFeatures over the trained classifier
    classes: list[str]


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> ImageGenModels:
    """Load a built `imagegen` entry as a user's upstream-layout files would be loaded; the GPT (and so its drafter)
    in `dtype`, as upstream LlamaGen samples in bf16, while the VQ decoder and the judge stay float32."""
    import timm

    from specmm.image_ar import ImageDrafter, LlamaGen
    from specmm.image_ar.metrics import TimmFeatures

    lg = LlamaGen.from_checkpoint(path / "gpt.pt", path / "vq.pt", path / "gpt_config.json",
                                  path / "vq_config.json").to(device)
    lg.gpt.to(dtype)
    drafter = ImageDrafter.from_pretrained(path / "drafter", lg.gpt)
    info = json.loads((path / "classifier.json").read_text())
    classifier = timm.create_model(info["model"], num_classes=info["num_classes"], pretrained=False)
    classifier.load_state_dict(torch.load(path / "classifier.pt", weights_only=True)["model"])
    return ImageGenModels(lg, drafter, TimmFeatures(classifier.to(device)), info["classes"])
