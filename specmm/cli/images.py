"""`specmm sample-images`: class-conditional sampling (LlamaGen checkpoints) or text-to-image sampling (a stock
generator folder such as Janus-Pro, `--model DIR --prompts FILE`) to PNGs and a grid, with a progress bar and resume.

The output folder is a job (`specmm.jobs`): `job.json` records what changes the images (method, its knobs,
seed, sampling, model fingerprints), `job.lock` refuses a second concurrent run, every PNG, the grid and
`summary.json` are written atomically. Batches are fixed slices of the job's (class, index) list, so a resumed
job samples exactly what an uninterrupted one would; `--resume` re-samples the batches holding a missing or
unreadable PNG and keeps the rest.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specmm.cli.common import (
    local_path,
    default_device,
    device_arg,
    dtype_arg,
    float_range,
    input_file,
    int_range,
    latent_size_arg,
    loading,
    model_folder,
    nonnegative_int,
    positive_int,
    probability,
    read_text_lines,
    temperature_arg,
)

logger = logging.getLogger(__name__)

OWNED = ("class*.png", "prompt*.png", "grid.png", "summary.json")  # what an image job writes (and --force deletes)
LLAMAGEN_ARGS = ("gpt_ckpt", "vq_ckpt", "gpt_config", "classes")


def parse_classes(text: str, num_classes: int) -> list[int]:
    try:
        classes = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--classes: expected comma-separated class ids, got {text!r}") from None
    bad = [c for c in classes if not 0 <= c < num_classes]
    if not classes or bad:
        raise ValueError(f"--classes: class ids must be in [0, {num_classes}), got {text!r}")
    if len(set(classes)) != len(classes):
        raise ValueError(f"--classes: each class id once, got {text!r}")
    return classes


def image_path(out: Path, label: int, index: int, prefix: str = "class") -> Path:
    """`class0001_000.png` (class 1, image 0), or `prompt0001_000.png` (prompt line 1) for text prompts."""
    return out / f"{prefix}{label:04d}_{index:03d}.png"


def image_seed(seed: int, label: int, index: int) -> int:
    """The noise seed of one image of a job (a function of the job seed, its class and its index)."""
    return seed * 1_000_003 + label * 1000 + index


def readable_png(path: Path) -> bool:
    """Whether `path` is a complete image file (a file cut short by a kill, or not an image, is not)."""
    from PIL import Image

    if not path.is_file():
        return False
    try:
        with Image.open(path) as image:
            image.verify()
        return True
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        logger.warning("%s: not a complete image; it is sampled again", path)
        return False


def plan_job(out: Path, classes: list[int], per_class: int, batch_size: int,
             prefix: str = "class") -> tuple[list, list]:
    """(every (class, index) of the job, the batches to run: fixed slices of that list of `batch_size` items,
    those holding an image without a readable PNG in `out`)."""
    jobs = [(c, i) for c in classes for i in range(per_class)]
    batches = [jobs[start: start + batch_size] for start in range(0, len(jobs), batch_size)]
    return jobs, [b for b in batches if not all(readable_png(image_path(out, *job, prefix)) for job in b)]


def image_job(args, kind: str, settings: dict):
    """The Job for an image folder: lock, manifest, resume / force / refuse."""
    from specmm.jobs import Job

    out = Path(args.out)
    return Job(out, kind, settings, resume=args.resume, force=args.force, folder=True, owned=OWNED, argument="--out")


def save_batch(out: Path, batch: list, images, prefix: str = "class") -> int:
    """Write a batch's PNGs atomically, skipping those already complete (a re-run batch of a resumed job); returns
    how many were written."""
    from specmm.jobs import atomic_save_image

    written = 0
    for job, image in zip(batch, images):
        path = image_path(out, *job, prefix)
        if not readable_png(path):
            atomic_save_image(image, path)
            written += 1
    return written


def cmd_sample_images(args) -> int:
    from specmm.image_ar import ImageDrafter
    from specmm.image_ar.methods import NEEDS_DRAFTER, make_sampler
    from specmm.jobs.job import check_output_path
    from specmm.jobs.shards import process_device

    check_output_path(args.out, "--out", folder=True)
    device = process_device(args.device)  # under `accelerate launch`: this process's GPU
    stock = check_source(args)
    if args.method in NEEDS_DRAFTER and not args.drafter:
        raise ValueError(f"--drafter: method {args.method!r} needs a trained image drafter (--drafter DIR)")
    if args.drafter:
        args.drafter = local_path(model_folder("--drafter", args.drafter, needs=""))
        ImageDrafter.read_config(args.drafter)  # a folder of another kind is refused before any model loads
    model, labels, conditions, settings = (load_stock(args, device) if stock else load_llamagen(args, device))
    drafter = None
    if args.drafter:
        with loading("--drafter", args.drafter, "image drafter"):
            drafter = ImageDrafter.from_pretrained(args.drafter, model if stock else model.gpt)
    sampler = make_sampler(model, args.method, drafter, delta=args.delta, lam=args.lam, gsd_window=args.gsd_window,
                           gsd_p_gap=args.gsd_gap, gsd_quantile=args.gsd_quantile, compile=args.compile)
    settings.update({"method": args.method, "seed": args.seed, "cfg_scale": args.cfg_scale,
                     "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p})
    if args.method == "lantern":
        settings["delta"] = args.delta
    if args.method == "lantern++":
        settings["lam"] = args.lam
    if args.method in ("gsd", "gsd-drafter"):
        settings.update({"gsd_window": args.gsd_window, "gsd_gap": args.gsd_gap, "gsd_quantile": args.gsd_quantile})
    if drafter is not None and args.method in ("exact", *NEEDS_DRAFTER):
        from specmm.jobs import fingerprint

        settings["drafter"] = fingerprint(args.drafter)
    run_image_job(args, sampler, labels, conditions, settings, "prompt" if stock else "class", device)
    return 0


def check_source(args) -> bool:
    """True for a stock generator folder (`--model` + `--prompts`), False for LlamaGen checkpoints (+ `--classes`);
    a ValueError for a mix or a half."""
    if args.model is not None:
        mixed = [f"--{name.replace('_', '-')}" for name in LLAMAGEN_ARGS if getattr(args, name) is not None]
        if mixed:
            raise ValueError(f"--model: a stock generator folder takes --prompts, not {', '.join(mixed)}")
        if args.prompts is None:
            raise ValueError("--prompts: --model needs a text file with one prompt per line")
        return True
    missing = [f"--{name.replace('_', '-')}" for name in LLAMAGEN_ARGS if getattr(args, name) is None]
    if missing:
        raise ValueError(f"{missing[0]}: required for LlamaGen checkpoints (or give --model DIR --prompts FILE for "
                         "a stock generator such as Janus-Pro)")
    if args.prompts is not None:
        raise ValueError("--prompts: text prompts go with --model DIR; LlamaGen checkpoints take --classes")
    if args.latent_size is not None:
        raise ValueError("--latent-size: for a stock generator folder (--model); LlamaGen's size is --image-size")
    if getattr(args, "negative_prompt", None) is not None:
        raise ValueError("--negative-prompt: for a stock generator folder (--model); LlamaGen guides with the null "
                         "class")
    return False


def load_llamagen(args, device):
    """(LlamaGen, class ids, class id of each label, job settings) from upstream checkpoints."""
    classes = llamagen_classes(args)  # bad files, config or classes: refused before the weights load
    lg = llamagen_model(args, device)
    settings = {**llamagen_settings(args), "image_size": lg.image_size}
    return lg, classes, lambda labels: torch.tensor(labels), settings


def llamagen_model(args, device):
    """The checkpoints' LlamaGen on `device` (arguments checked by `llamagen_classes` first), its GPT (and so a
    drafter) in --dtype, as upstream samples in bf16; the VQ decoder stays float32."""
    from specmm.image_ar import LlamaGen

    with loading("--gpt-ckpt/--vq-ckpt", f"{args.gpt_ckpt} and {args.vq_ckpt}", "LlamaGen checkpoints"):
        lg = LlamaGen.from_checkpoint(args.gpt_ckpt, args.vq_ckpt, args.gpt_config, args.vq_config,
                                      image_size=args.image_size).to(device)
    lg.gpt.to(args.dtype)
    return lg


def llamagen_settings(args) -> dict:
    """What of a LlamaGen job's source changes its output: the checkpoints' fingerprints and the configs."""
    from specmm.jobs import fingerprint

    def config(value) -> str:  # a preset by name, a JSON file by content (edited in place: another job)
        return fingerprint(value) if value is not None and Path(value).is_file() else str(value)

    settings = {"gpt": fingerprint(args.gpt_ckpt), "vq": fingerprint(args.vq_ckpt),
                "gpt_config": config(args.gpt_config), "vq_config": config(args.vq_config)}
    if args.dtype != torch.float32:  # float32 jobs keep the settings they had before --dtype served LlamaGen
        settings["dtype"] = str(args.dtype)
    return settings


def stock_prompts(args) -> tuple[Path, list[str]]:
    """The `--model` folder and the `--prompts` lines, checked (a missing folder or file, no prompt) before any
    model loads."""
    folder = model_folder("--model", args.model)
    prompts = read_text_lines("--prompts", args.prompts)
    if not prompts:
        raise ValueError(f"--prompts: {args.prompts} holds no prompt (one per line)")
    return folder, prompts


def load_stock(args, device):
    """(the folder's ImageModel, prompt line indices, prompts of each batch, job settings) from a folder saved with
    `save_pretrained` (model and processor)."""
    from specmm.image_ar.models import image_model_for, load_pretrained
    from specmm.jobs import fingerprint
    from specmm.jobs.content import text_key

    folder, prompts = stock_prompts(args)
    with loading("--model", folder):
        model, processor = load_pretrained(folder, args.dtype, device, args.latent_size)
    # ValueError naming the class when it is no image generator, or one of a fixed size given --latent-size
    image_model = image_model_for(model, processor, latent_size=args.latent_size)
    settings = {"model": fingerprint(folder), "prompts": [text_key(p) for p in prompts], "dtype": str(args.dtype)}
    if args.latent_size is not None:  # a job's images keep one size: resuming with another refuses
        settings["latent_size"] = list(args.latent_size)
    if args.negative_prompt is not None:
        if not hasattr(image_model, "negative_prompt"):
            raise ValueError(f"--negative-prompt: {type(model).__name__} takes no negative prompt (Emu3 does)")
        settings["negative_prompt"] = args.negative_prompt
    return image_model, list(range(len(prompts))), lambda labels: [prompts[i] for i in labels], settings


def run_image_job(args, sampler, labels: list[int], conditions, settings: dict, prefix: str, device) -> None:
    """Sample every (label, index) image of the job in fixed batches (resume: only batches missing a PNG), then
    write the grid and summary.json."""
    from specmm.jobs.shards import Processes, shared_job

    out = Path(args.out)
    processes = Processes(cpu=device.type == "cpu")
    with shared_job(image_job(args, "sample-images", settings), processes):
        # the plan of the main process (what is on disk before anyone writes), the same on every process
        jobs, todo = processes.share(plan_job(out, labels, args.per_class, args.batch_size, prefix)
                                     if processes.is_main else None)
        forwards = tokens = written = 0
        options = {} if args.negative_prompt is None else {"negative_prompt": args.negative_prompt}  # Emu3's
        with ImagesBar(out, sum(len(b) for b in todo), f"sample-images {args.method}", processes, prefix) as bar:
            for batch in processes.my_share(todo):
                generators = [torch.Generator(device=device).manual_seed(image_seed(args.seed, c, i))
                              for c, i in batch]
                res = sampler.sample(conditions([c for c, _ in batch]), cfg_scale=args.cfg_scale, **options,
                                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                     generator=generators)
                written += save_batch(out, batch, res.images, prefix)
                forwards += res.stats.row_forwards
                tokens += res.stats.new_tokens
                bar.advance(len(batch))
        processes.barrier()
        written, forwards, tokens = (sum(c) for c in zip(*processes.gather((written, forwards, tokens))))
        summary = {"method": args.method, "settings": settings, "images": len(jobs), "sampled_now": written,
                   "step_compression_now": tokens / forwards if forwards else None}
        if processes.is_main:
            finish_job(out, [image_path(out, *j, prefix) for j in jobs], args.per_class, summary,
                       "step_compression_now")


class ImagesBar:
    """The main process's progress bar over the whole job: with several processes it counts the class images in
    the folder (every process writes there), else this process's own."""

    def __init__(self, out: Path, total: int, desc: str, processes, prefix: str = "class"):
        self.out, self.processes, self.prefix = out, processes, prefix
        self.start = self._count()
        self.bar = tqdm(total=total, desc=desc, unit="img", disable=not processes.is_main)

    def _count(self) -> int:
        return sum(1 for _ in self.out.glob(f"{self.prefix}*.png")) if self.processes.size > 1 else 0

    def advance(self, images: int) -> None:
        step = images if self.processes.size == 1 else max(self._count() - self.start - self.bar.n, 0)
        self.bar.update(min(step, self.bar.total - self.bar.n))

    def __enter__(self) -> ImagesBar:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def finish_job(out: Path, images: list[Path], columns: int, summary: dict, per_forward: str) -> None:
    """Write the grid of every image of the job and summary.json (atomically); print a one-line report."""
    from PIL import Image

    from specmm.image_ar.images import image_grid
    from specmm.jobs import atomic_save_image, atomic_write_json

    opened = []
    for path in images:
        with Image.open(path) as image:
            opened.append(image.convert("RGB"))
    atomic_save_image(image_grid(opened, columns), out / "grid.png")
    atomic_write_json(out / "summary.json", summary)
    rate = summary[per_forward]
    print(f"{summary['sampled_now']} new images ({summary['images']} total) -> {out}; grid {out / 'grid.png'}"
          + (f"; {rate:.2f} tokens per target forward" if rate is not None else ""))


def add_parser(sub) -> None:
    p = sub.add_parser("sample-images", help="sample images: class-conditional from LlamaGen checkpoints, or from text "
                                             "prompts with a stock generator folder (Janus-Pro: --model --prompts)")
    p.add_argument("--model", help="stock image generator folder (save_pretrained: model + processor), e.g. Janus-Pro")
    p.add_argument("--prompts", help="with --model: text file, one prompt per line (images named promptNNNN_MMM.png)")
    p.add_argument("--dtype", type=dtype_arg, default=torch.float32,
                   help="weights dtype (LlamaGen: the GPT's, its VQ decoder stays float32)")
    p.add_argument("--latent-size", type=latent_size_arg,
                   help="with --model, for generators of any size (Emu3): HxW latent tokens (default: the processor's)")
    p.add_argument("--negative-prompt", help="with --model, for generators that take one (Emu3): the text guidance "
                   "steers away from (default: the model's own, HF's last-token guidance)")
    add_llamagen_arguments(p)
    p.add_argument("--per-class", type=int_range(1, 1000), default=4, help="images per class or prompt (1..1000)")
    p.add_argument("--method", default="sjd",
                   choices=["ar", "exact", "sjd", "lantern", "lantern++", "gsd", "gsd-drafter"])
    p.add_argument("--drafter", help="image drafter folder (needed by lantern, lantern++ and gsd-drafter)")
    p.add_argument("--delta", type=float_range(0.0, 1.0), default=0.1, help="LANTERN TV budget in [0, 1]")
    p.add_argument("--lam", type=float_range(1.0), default=5.0, help="LANTERN++ lambda (>= 1)")
    p.add_argument("--gsd-window", type=positive_int, default=14,
                   help="GSD: nearest codebook neighbours a draft token's group may take (1: exact)")
    p.add_argument("--gsd-gap", type=float_range(0.0, 1.0), default=0.15,
                   help="GSD: largest target-probability gap between a draft token and a group member")
    p.add_argument("--gsd-quantile", type=float_range(0.0, 1.0), default=0.05,
                   help="GSD: codebook pair-distance quantile that sets the group radius, in (0, 1]")
    p.add_argument("--cfg-scale", type=float_range(1.0), default=4.0, help="guidance scale (finite, >= 1)")
    p.add_argument("--temperature", type=temperature_arg, default=1.0)
    p.add_argument("--top-k", type=nonnegative_int, default=2000, help="0 disables top-k")
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--compile", action="store_true",
                   help="compiled fast path (static caches, compiled verify/draft/acceptance, same images); the first "
                        "batch of each size compiles")
    add_job_arguments(p, batch_size=8)
    p.set_defaults(func=cmd_sample_images)


def add_llamagen_arguments(p) -> None:
    """Upstream LlamaGen checkpoints (class-conditional), the other source of images than `--model DIR`."""
    p.add_argument("--gpt-ckpt", help="upstream LlamaGen GPT .pt ({'model': state_dict})")
    p.add_argument("--vq-ckpt", help="upstream LlamaGen VQ .pt")
    p.add_argument("--gpt-config", help="preset (GPT-B, GPT-L, ...) or JSON file")
    p.add_argument("--vq-config", default="VQ-16", help="preset (VQ-16, VQ-8) or JSON file")
    p.add_argument("--image-size", type=positive_int,
                   help="pixels (default and only valid value: the GPT's token grid x the VQ downsample)")
    p.add_argument("--classes", help="LlamaGen: comma-separated class ids, e.g. 1,2")


def llamagen_classes(args) -> list[int]:
    """The `--classes` of a LlamaGen job, checked against its GPT config before any weights load (after the
    checkpoint files are found); class-conditional GPTs only."""
    from specmm.image_ar.llamagen.config import gpt_config

    for argument in ("--gpt-ckpt", "--vq-ckpt"):
        input_file(argument, getattr(args, argument[2:].replace("-", "_")))
    try:
        config = gpt_config(args.gpt_config)
    except (ValueError, TypeError, OSError) as error:
        raise ValueError(f"--gpt-config: {error}") from None
    if config.model_type != "c2i":
        raise ValueError(f"--gpt-config: a {config.model_type} GPT (text to image) takes caption embeddings, not "
                         "--classes; only class-conditional (c2i) checkpoints run from the command line")
    return parse_classes(args.classes, config.num_classes)


def add_job_arguments(p, batch_size: int) -> None:
    """The options every image-sampling job shares: batch size, seed, output folder, resume / force, device."""
    p.add_argument("--batch-size", type=positive_int, default=batch_size)
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--out", required=True)
    job = p.add_mutually_exclusive_group()
    job.add_argument("--resume", action="store_true",
                     help="continue the same job in --out: keep its complete PNGs and sample the rest")
    job.add_argument("--force", action="store_true", help="delete the images --out holds and start over")
    p.add_argument("--device", type=device_arg, default=default_device())


__all__ = ["OWNED", "ImagesBar", "add_job_arguments", "add_llamagen_arguments", "add_parser", "cmd_sample_images",
           "finish_job", "image_job", "image_path", "image_seed", "llamagen_classes", "llamagen_model",
           "llamagen_settings", "load_llamagen", "parse_classes", "plan_job", "readable_png", "save_batch",
           "stock_prompts"]
