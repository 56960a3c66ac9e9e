"""`specmm train-image-drafter`: an image drafter (LANTERN, exact SD, gsd-drafter) for a stock image generator
folder (Janus-Pro, Emu3; `--model DIR --prompts FILE`) or upstream class-conditional LlamaGen checkpoints
(`--gpt-ckpt ... --classes ...`: LANTERN's own setting), trained on images the model samples itself.

The output folder is a job: its manifest names what changes the drafter, a rerun of the same job resumes (the
sampled images are kept a slice at a time, the head and optimizer every --checkpoint-every steps, each file
written atomically) and ends with the drafter an uninterrupted run gives, a different job there is refused
(--force starts over), and a second concurrent run is refused.
"""

from __future__ import annotations

import torch

from specmm.cli.common import (
    add_job_options,
    default_device,
    device_arg,
    dtype_arg,
    float_range,
    latent_size_arg,
    loading,
    nonnegative_int,
    positive_int,
    probability,
    temperature_arg,
)
from specmm.cli.images import (
    add_llamagen_arguments,
    check_source,
    llamagen_classes,
    llamagen_model,
    llamagen_settings,
    stock_prompts,
)

OWNED = ("config.json", "model.safetensors", "work/*")  # what --force deletes


def cmd_train_image_drafter(args) -> int:
    from specmm.image_ar.drafter_train import DrafterTrainConfig, train_image_drafter
    from specmm.jobs import Job

    stock = check_source(args)  # cheap errors (a mix of sources, files, prompts, classes) before any model loads
    source, conditions = _stock_source(args) if stock else _llamagen_source(args)
    device = torch.device(args.device)
    config = DrafterTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    settings = {**source, "images_per_prompt": args.images_per_prompt, "steps": args.steps,
                "batch_size": args.batch_size, "lr": args.lr, "cfg_scale": args.cfg_scale,
                "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
                "sample_batch_size": args.sample_batch_size}
    with Job(args.out, "train-image-drafter", settings, resume=True, force=args.force, folder=True, owned=OWNED):
        image_model = _load(args, device) if stock else llamagen_model(args, device)
        drafter = train_image_drafter(image_model, conditions, cfg_scale=args.cfg_scale, temperature=args.temperature,
                                      top_k=args.top_k, top_p=args.top_p, images_per_prompt=args.images_per_prompt,
                                      config=config, seed=args.seed, checkpoint_dir=f"{args.out}/work",
                                      checkpoint_every=args.checkpoint_every,
                                      sample_batch_size=args.sample_batch_size)
        drafter.save_pretrained(args.out)
    source_args = (f"--model {args.model}" if stock else
                   f"--gpt-ckpt {args.gpt_ckpt} --vq-ckpt {args.vq_ckpt} --gpt-config {args.gpt_config} --classes ...")
    print(f"saved the image drafter to {args.out} (use: specmm sample-images {source_args} --method lantern "
          f"--drafter {args.out} ...)")
    return 0


def _stock_source(args) -> tuple[dict, list[str]]:
    """(job settings, prompts) of a stock folder, its prompts and latent size checked (cheaply: config.json only)."""
    from specmm.image_ar.models import check_latent_size, folder_class_name
    from specmm.jobs import fingerprint
    from specmm.jobs.content import text_key

    folder, prompts = stock_prompts(args)
    with loading("--model", folder):
        check_latent_size(folder_class_name(folder), args.latent_size)  # before the job takes --out
    settings = {"model": fingerprint(folder), "prompts": [text_key(p) for p in prompts],
                "latent_size": args.latent_size and list(args.latent_size), "dtype": str(args.dtype)}
    return settings, prompts


def _llamagen_source(args) -> tuple[dict, torch.Tensor]:
    """(job settings, class ids [C]) of LlamaGen checkpoints, the files, config and classes checked before any
    weights load."""
    classes = llamagen_classes(args)
    return {**llamagen_settings(args), "image_size": args.image_size, "classes": classes}, torch.tensor(classes)


def _load(args, device):
    """The folder's image model (its latent size is checked by `_stock_source`)."""
    from specmm.image_ar.models import image_model_for, load_pretrained

    with loading("--model", args.model):
        model, processor = load_pretrained(args.model, args.dtype, device)
    return image_model_for(model, processor, latent_size=args.latent_size)


def add_parser(sub) -> None:
    p = sub.add_parser("train-image-drafter", help="train an image drafter (LANTERN, exact SD) for a stock image "
                                                   "generator folder or LlamaGen checkpoints on images it samples "
                                                   "from your prompts or classes")
    p.add_argument("--model", help="stock image generator folder (save_pretrained: model + processor)")
    p.add_argument("--prompts", help="with --model: text file, one prompt per line")
    add_llamagen_arguments(p)
    p.add_argument("--latent-size", type=latent_size_arg,
                   help="for generators of any size (Emu3): HxW latent tokens (default: the processor's)")
    p.add_argument("--out", required=True, help="output folder (the drafter; checkpoints under OUT/work)")
    p.add_argument("--images-per-prompt", type=positive_int, default=1, help="images sampled per prompt or class")
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per training step")
    p.add_argument("--lr", type=float_range(0.0, low_open=True), default=1e-3)
    p.add_argument("--checkpoint-every", type=positive_int, default=200, help="steps between checkpoints")
    p.add_argument("--sample-batch-size", type=positive_int, default=8, help="prompts per sampling batch")
    p.add_argument("--cfg-scale", type=float_range(1.0), default=5.0, help="guidance the images are sampled with")
    p.add_argument("--temperature", type=temperature_arg, default=1.0)
    p.add_argument("--top-k", type=nonnegative_int, default=0, help="0 disables top-k")
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seeds the images, the head and the batches")
    add_job_options(p)
    p.add_argument("--device", type=device_arg, default=default_device())
    p.add_argument("--dtype", type=dtype_arg, default=torch.float32,
                   help="weights dtype (LlamaGen: the GPT's, its VQ decoder stays float32)")
    p.set_defaults(func=cmd_train_image_drafter)


__all__ = ["add_parser", "cmd_train_image_drafter"]
