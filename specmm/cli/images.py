"""`specmm sample-images`: class-conditional sampling to PNGs and a grid, with a progress bar and resume."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specmm.cli.common import default_device


def parse_classes(text: str, num_classes: int) -> list[int]:
    try:
        classes = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--classes: expected comma-separated class ids, got {text!r}") from None
    bad = [c for c in classes if not 0 <= c < num_classes]
    if not classes or bad:
        raise ValueError(f"--classes: class ids must be in [0, {num_classes}), got {text!r}")
    return classes


def image_path(out: Path, label: int, index: int) -> Path:
    return out / f"class{label:04d}_{index:03d}.png"


def image_seed(seed: int, label: int, index: int) -> int:
    """The noise seed of one image of a job (a function of the job seed, its class and its index)."""
    return seed * 1_000_003 + label * 1000 + index


def plan_job(out: Path, classes: list[int], per_class: int, resume: bool) -> tuple[list, list]:
    """(every (class, index) of the job, those without a PNG in `out` yet); a folder that already holds images is
    refused unless `resume`. Creates `out`."""
    if out.exists() and any(out.glob("class*.png")) and not resume:
        raise ValueError(f"--out: {out} already holds images; pass --resume to continue or pick a new folder")
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, i) for c in classes for i in range(per_class)]
    return jobs, [job for job in jobs if not image_path(out, *job).is_file()]


def cmd_sample_images(args) -> int:
    from specmm.image_ar import ImageDrafter, LlamaGen
    from specmm.image_ar.methods import make_sampler

    out = Path(args.out)
    lg = LlamaGen.from_checkpoint(args.gpt_ckpt, args.vq_ckpt, args.gpt_config, args.vq_config,
                                  image_size=args.image_size).to(args.device)
    classes = parse_classes(args.classes, lg.config.num_classes)
    drafter = ImageDrafter.from_pretrained(args.drafter, lg.gpt) if args.drafter else None
    sampler = make_sampler(lg, args.method, drafter, delta=args.delta, lam=args.lam)
    jobs, todo = plan_job(out, classes, args.per_class, args.resume)
    forwards = tokens = 0
    for start in tqdm(range(0, len(todo), args.batch_size), desc=f"sample-images {args.method}"):
        batch = todo[start: start + args.batch_size]
        generators = [torch.Generator(device=args.device).manual_seed(image_seed(args.seed, c, i)) for c, i in batch]
        res = sampler.sample(torch.tensor([c for c, _ in batch]), cfg_scale=args.cfg_scale,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generators)
        for (c, i), image in zip(batch, res.images):
            image.save(image_path(out, c, i))
        forwards += res.stats.row_forwards
        tokens += res.stats.new_tokens
    summary = {"method": args.method, "images": len(jobs), "sampled_now": len(todo),
               "step_compression_now": tokens / forwards if forwards else None}
    finish_job(out, [image_path(out, *j) for j in jobs], args.per_class, summary, "step_compression_now")
    return 0


def finish_job(out: Path, images: list[Path], columns: int, summary: dict, per_forward: str) -> None:
    """Write the grid of every image of the job and summary.json; print a one-line report."""
    from PIL import Image

    from specmm.image_ar.images import image_grid

    image_grid([Image.open(path) for path in images], columns).save(out / "grid.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    rate = summary[per_forward]
    print(f"{summary['sampled_now']} new images ({summary['images']} total) -> {out}; grid {out / 'grid.png'}"
          + (f"; {rate:.2f} tokens per target forward" if rate is not None else ""))


def add_parser(sub) -> None:
    p = sub.add_parser("sample-images", help="sample class-conditional images from LlamaGen checkpoints")
    p.add_argument("--gpt-ckpt", required=True, help="upstream LlamaGen GPT .pt ({'model': state_dict})")
    p.add_argument("--vq-ckpt", required=True, help="upstream LlamaGen VQ .pt")
    p.add_argument("--gpt-config", required=True, help="preset (GPT-B, GPT-L, ...) or JSON file")
    p.add_argument("--vq-config", default="VQ-16", help="preset (VQ-16, VQ-8) or JSON file")
    p.add_argument("--image-size", type=int, help="pixels (default: grid x downsample)")
    p.add_argument("--classes", required=True, help="comma-separated class ids, e.g. 1,2")
    p.add_argument("--per-class", type=int, default=4)
    p.add_argument("--method", default="sjd", choices=["ar", "exact", "sjd", "lantern", "lantern++", "gsd"])
    p.add_argument("--drafter", help="image drafter folder (needed by lantern and lantern++)")
    p.add_argument("--delta", type=float, default=0.1, help="LANTERN TV budget")
    p.add_argument("--lam", type=float, default=5.0, help="LANTERN++ lambda")
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=2000)
    p.add_argument("--top-p", type=float, default=1.0)
    add_job_arguments(p, batch_size=8)
    p.set_defaults(func=cmd_sample_images)


def add_job_arguments(p, batch_size: int) -> None:
    """The options every image-sampling job shares: batch size, seed, output folder, resume, device."""
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="keep the PNGs already in --out and sample the rest")
    p.add_argument("--device", default=default_device())


__all__ = ["add_job_arguments", "add_parser", "cmd_sample_images", "finish_job", "image_path", "image_seed",
           "parse_classes", "plan_job"]
