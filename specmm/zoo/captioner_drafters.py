"""Zoo entry `captioner-drafters`: every VisionDrafter method trained against the zoo `captioner`.

The target regenerates captions of training scenes itself (greedy), so drafters learn the target's own
outputs (ViSpec's recipe); each method then trains two stages, text (captions without the image) and
multimodal, by online distillation. Each method is saved with `VisionDrafter.save_pretrained` under its
name; zoo.json records the losses and the teacher-forced top-1 agreement per method and stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specmm.jobs import atomic_write_text
from specmm.zoo import captioner

METHODS = ("eagle", "msd", "vispec", "dream", "flash")
RECIPES = {
    "tiny": dict(captioner_scale="tiny", scenes=8, batch_size=4, max_new_tokens=24, methods=list(METHODS),
                 method_options={"flash": {"num_latents": 2, "sar_steps": 2}},
                 text=dict(steps=2, lr=1e-3, warmup_steps=1, checkpoint_every=1),
                 multimodal=dict(steps=2, lr=1e-3, warmup_steps=1, checkpoint_every=1)),
    "cpu": dict(captioner_scale="cpu", scenes=512, batch_size=8, max_new_tokens=220, methods=list(METHODS),
                method_options={"flash": {"num_latents": 4, "sar_steps": 3}},  # 9 image tokens -> 4
                text=dict(steps=120, lr=1e-3, warmup_steps=20, checkpoint_every=60),
                multimodal=dict(steps=330, lr=1e-3, warmup_steps=20, checkpoint_every=60)),
    # EAGLE against ViSpec on the 144-token `cpu-long` captioner, with the `cpu` recipe's steps
    "cpu-long": dict(captioner_scale="cpu-long", scenes=512, batch_size=8, max_new_tokens=220,
                     methods=["eagle", "vispec"],
                     text=dict(steps=120, lr=1e-3, warmup_steps=20, checkpoint_every=60),
                     multimodal=dict(steps=330, lr=1e-3, warmup_steps=20, checkpoint_every=60)),
    "gpu": dict(device="cuda", captioner_scale="gpu", scenes=4096, batch_size=32, max_new_tokens=220,
                methods=list(METHODS),
                method_options={"flash": {"num_latents": 12, "sar_steps": 3}},  # 36 image tokens -> 12
                text=dict(steps=1000, lr=5e-4, warmup_steps=100, checkpoint_every=250),
                multimodal=dict(steps=3000, lr=5e-4, warmup_steps=100, checkpoint_every=250)),
}


def only(method: str, **cpu_changes) -> dict[str, dict]:
    """The recipes restricted to one method (seeded on its own, as in the full entry), `cpu_changes` on cpu."""
    recipes = {scale: {**recipe, "methods": [method]} for scale, recipe in RECIPES.items()}
    recipes["cpu"] = {**recipes["cpu"], **cpu_changes}
    return recipes


TRAIN_SEED_BASE = 7 * 10**8  # training scenes never overlap the captioner's held-out seeds (10**9 + i)


def regenerated_captions(models: captioner.CaptionerModels, count: int, max_new_tokens: int, work: Path) -> list:
    """[(seed, caption)] of the target's own greedy captions of training scenes (cached in work/)."""
    cache = work / "captions.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    seeds = [TRAIN_SEED_BASE + i for i in range(count)]
    captions = captioner.caption_scenes(models.target, models.processor, seeds, models.image_size, max_new_tokens)
    pairs = [[s, c] for s, c in zip(seeds, captions)]
    atomic_write_text(cache, json.dumps(pairs))
    return pairs


def caption_batches(models: captioner.CaptionerModels, pairs: list, batch_size: int):
    """step -> processor batch (left padded) of scenes with their regenerated captions, cycling."""
    processor = models.processor
    eos = processor.tokenizer.eos_token

    def batch(step: int) -> dict[str, torch.Tensor]:
        chosen = [pairs[(step * batch_size + i) % len(pairs)] for i in range(batch_size)]
        images = [captioner.scenes.render(captioner.scene_and_caption(s)[0], models.image_size, seed=s)
                  for s, _ in chosen]
        processor.tokenizer.padding_side = "left"
        enc = processor(images=images, text=[captioner.PROMPT + c + eos for _, c in chosen], return_tensors="pt",
                        padding=True)
        return {k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values")}

    return batch


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    from specmm import zoo
    from specmm.vlm import DrafterTrainConfig, VisionDrafter, train_drafter

    # target and drafters on the recipe's device (the drafter heads follow the target's), saved from there
    models = captioner.load(zoo.build("captioner", recipe["captioner_scale"], progress=progress),
                            zoo.training_device(recipe))
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    pairs = regenerated_captions(models, recipe["scenes"], recipe["max_new_tokens"], work)
    batches = caption_batches(models, pairs, recipe["batch_size"])
    record = {"captioner": str(zoo.path("captioner", recipe["captioner_scale"])), "methods": {}}
    for method in recipe["methods"]:
        torch.manual_seed(seed)
        drafter = VisionDrafter.for_target(models.target, method=method,
                                           **recipe.get("method_options", {}).get(method, {}))
        stats = {"parameters": sum(p.numel() for p in drafter.head.parameters())}
        previous = None
        for stage in ("text", "multimodal"):
            folder = work / method / stage
            if previous is not None and not (folder / "trainer_state.pt").is_file():
                drafter = VisionDrafter.from_pretrained(previous, models.target)  # stage 2 starts from stage 1
            torch.manual_seed(seed + (stage == "multimodal"))
            parts_log: list[dict] = []
            config = DrafterTrainConfig(**recipe[stage])
            losses = train_drafter(models.target, models.processor, drafter, batches, config, stage=stage,
                                   checkpoint_dir=folder, progress=progress,
                                   on_step=lambda step, loss, parts: parts_log.append(parts))
            stats[stage] = _stage_record(folder, losses, parts_log, config.steps)
            previous = folder
        drafter.save_pretrained(dest / method)
        record["methods"][method] = stats
    return record


def _stage_record(folder: Path, losses: list[float], parts: list[dict], steps: int) -> dict:
    """Loss and top-1 over the last 10 % of steps; kept in the stage folder so a resumed build still has it."""
    path = folder / "record.json"
    if not losses and path.is_file():
        return json.loads(path.read_text())
    tail = max(1, len(losses) // 10)
    record = {"steps": steps, "first_loss": losses[0] if losses else None,
              "final_loss": sum(losses[-tail:]) / tail if losses else None,
              "final_top1": sum(p["top1"] for p in parts[-tail:]) / tail if parts else None}
    path.write_text(json.dumps(record))
    return record


def load(path: Path, method: str, target) -> "VisionDrafter":  # noqa: F821
    from specmm.vlm import VisionDrafter

    return VisionDrafter.from_pretrained(path / method, target)
