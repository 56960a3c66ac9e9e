"""`specmm caption` (a folder of images -> JSON lines with a VLM) and `specmm train-drafter` (a VisionDrafter)."""

from __future__ import annotations

import torch

import specmm
from specmm.cli.common import (
    local_path,
    add_job_options,
    scale_argument,
    DRAFT_DEFAULTS,
    default_device,
    device_arg,
    dtype_arg,
    float_range,
    input_file,
    loading,
    mkdir,
    model_folder,
    nonnegative_int,
    positive_int,
    temperature_arg,
)


TRAIN_OWNED = ("config.json", "model.safetensors", "captions.json", "text/*", "multimodal/*")  # what --force deletes


def cmd_train_drafter(args) -> int:
    """Train a VisionDrafter into --out. The folder is a job: its manifest (job.json) names what changes the
    drafter, a rerun of the same job resumes from the stage checkpoints (as before), a different job in the same
    folder is refused (--force starts over), and a second concurrent run is refused. Under `accelerate launch` it
    trains data-parallel: every process takes an equal share of each batch; the main process holds the job and
    writes every file."""
    from specmm import zoo
    from specmm.jobs import Job, fingerprint
    from specmm.jobs.shards import Processes, process_device, shared_job
    from specmm.vlm import DrafterTrainConfig, VisionDrafter, train_drafter
    from specmm.vlm.train import jsonl_batches
    from specmm.zoo import captioner, captioner_drafters

    args.target = local_path(model_folder("--target", args.target))
    args.init = local_path(model_folder("--init", args.init, needs=""))
    if args.data:
        input_file("--data", args.data)
    elif args.target:
        raise ValueError("--data: a captions .jsonl (e.g. from `specmm caption`) is needed with --target")
    device = process_device(args.device)  # under `accelerate launch`: this process's GPU
    processes = Processes(cpu=device.type == "cpu")
    if args.batch_size % processes.size:
        raise ValueError(f"--batch-size {args.batch_size}: each of the {processes.size} processes takes an equal "
                         f"share of every batch; use a multiple of {processes.size}")
    settings = {"method": args.method, "text_steps": args.text_steps, "multimodal_steps": args.multimodal_steps,
                "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
                "dtype": str(args.dtype).removeprefix("torch."),
                "target": fingerprint(args.target) if args.target else f"zoo captioner-{args.scale}",
                "data": {"file": fingerprint(args.data), "prompt": args.prompt} if args.data else
                {"zoo scenes": args.scenes},
                "init": fingerprint(args.init) if args.init else None}
    job = Job(args.out, "train-drafter", settings, resume=True, force=args.force, folder=True, owned=TRAIN_OWNED)
    with shared_job(job, processes):
        if args.target:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            with loading("--target", args.target):
                target = AutoModelForImageTextToText.from_pretrained(args.target, dtype=args.dtype,
                                                                     attn_implementation="sdpa").to(device).eval()
                processor = AutoProcessor.from_pretrained(args.target)
        else:
            models = captioner.load(zoo.build("captioner", args.scale), device=device, dtype=args.dtype)
            target, processor = models.target, models.processor
        if args.data:
            batches = jsonl_batches(args.data, processor, args.prompt, args.batch_size)
        else:  # regenerated (and cached in --out) by the main process
            pairs = processes.share(captioner_drafters.regenerated_captions(models, args.scenes, 220, mkdir(args.out))
                                    if processes.is_main else None)
            batches = captioner_drafters.caption_batches(models, pairs, args.batch_size)
        # seeded here, after the (cached) captions: the head's initialisation and the training noise are the same
        # in a rerun whatever ran before (and on every process)
        torch.manual_seed(args.seed)
        if args.init:
            with loading("--init", args.init, "drafter"):
                drafter = VisionDrafter.from_pretrained(args.init, target)
        else:
            drafter = VisionDrafter.for_target(target, method=args.method)
        for stage, steps in (("text", args.text_steps), ("multimodal", args.multimodal_steps)):
            if steps:
                config = DrafterTrainConfig(steps=steps, lr=args.lr, checkpoint_every=args.checkpoint_every)
                losses = train_drafter(target, processor, drafter, batches, config, stage=stage,
                                       checkpoint_dir=f"{args.out}/{stage}")
                if losses and processes.is_main:
                    print(f"{stage}: final loss {sum(losses[-10:]) / len(losses[-10:]):.4f}")
        if processes.is_main:
            drafter.save_pretrained(args.out)
    if processes.is_main:
        print(f"saved the {drafter.method} drafter to {args.out}")
    return 0


def cmd_caption(args) -> int:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from specmm.core.context import check_budget, context_limit
    from specmm.drafters import ModelDrafter, PromptLookupDrafter
    from specmm.jobs import fingerprint
    from specmm.jobs.shards import Processes, process_device
    from specmm.vlm import SpeculativeVLM, caption_images, find_images
    from specmm.vlm.caption import DEFAULT_PROMPT, caption_prompt, check_output

    paths = find_images(args.images)  # cheap errors before any model is loaded
    check_output(args.out, args.resume, args.force, "--out")
    args.target = local_path(model_folder("--target", args.target))
    args.draft_lm = local_path(model_folder("--draft-lm", args.draft_lm))
    if args.drafter and args.drafter != "prompt-lookup":
        args.drafter = local_path(model_folder("--drafter", args.drafter, needs=""))
    sampling = specmm.SamplingConfig(temperature=args.temperature)
    device = process_device(args.device)  # under `accelerate launch`: this process's GPU
    load = dict(dtype=args.dtype, attn_implementation="sdpa")
    with loading("--target", args.target):
        target = AutoModelForImageTextToText.from_pretrained(args.target, **load).to(device).eval()
        processor = AutoProcessor.from_pretrained(args.target)
    draft = DRAFT_DEFAULTS.get(device.type, DRAFT_DEFAULTS["cuda"])
    tree = specmm.TreeSpec.dynamic(depth=draft["depth"], top_k=draft["top_k"], total_tokens=draft["total_tokens"])
    if args.draft_lm:
        with loading("--draft-lm", args.draft_lm):
            drafter = ModelDrafter(AutoModelForCausalLM.from_pretrained(args.draft_lm, **load).to(device).eval())
    elif args.drafter == "prompt-lookup":
        drafter, tree = PromptLookupDrafter(ngram=3, k=8), specmm.TreeSpec.chain(8)
    else:
        try:
            from specmm.vlm import VisionDrafter
        except ImportError:
            raise ValueError(f"--drafter {args.drafter}: a drafter folder needs specmm.vlm.VisionDrafter, which "
                             "this install lacks; use --drafter prompt-lookup or --draft-lm DIR") from None
        with loading("--drafter", args.drafter, "drafter"):
            drafter = VisionDrafter.from_pretrained(args.drafter, target)
    svlm = SpeculativeVLM(target, processor, drafter, tree=tree, compile=args.compile)
    check_budget(args.max_new_tokens, context_limit(target), "--max-new-tokens", tree.depth + 1)
    models = {"target": fingerprint(args.target), "dtype": str(args.dtype).removeprefix("torch."),
              "drafter": fingerprint(args.draft_lm) if args.draft_lm else (
                  args.drafter if args.drafter == "prompt-lookup" else fingerprint(args.drafter))}
    summary = caption_images(svlm, paths, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                             resume=args.resume, force=args.force, sampling=sampling,
                             prompt=caption_prompt(processor, args.prompt or DEFAULT_PROMPT), settings=models,
                             argument="--out")
    if not Processes(cpu=device.type == "cpu").is_main:
        return 0  # under `accelerate launch` the main process reports the whole job
    done = summary.caption
    compiling = (f" (of which {summary.compile_time_s:.1f} s compiling new shapes)" if args.compile else "")
    print(f"captioned {done.captioned}, skipped {done.skipped}, errors {done.errors}; "
          f"{summary.new_tokens} tokens, mean accepted {summary.mean_accepted:.2f}, {summary.wall_time_s:.1f} s"
          f"{compiling} -> {args.out}")
    return 0


def add_parsers(sub) -> None:
    """Register `train-drafter` and `caption`."""
    train = sub.add_parser("train-drafter", help="train a VisionDrafter against a VLM by online distillation")
    train.add_argument("--method", default="vispec", help="eagle | msd | vispec | dream | flash")
    train.add_argument("--target", help="local HF VLM folder (default: the zoo captioner)")
    train.add_argument("--data", help="captions .jsonl with image and caption fields (e.g. `specmm caption` output "
                       "of the target itself: ViSpec's regeneration recipe)")
    train.add_argument("--prompt", default="Describe the picture in detail.", help="instruction used with --data")
    train.add_argument("--init", help="start from this drafter folder (e.g. a text-stage checkpoint)")
    train.add_argument("--out", required=True, help="output folder (checkpoints under OUT/text, OUT/multimodal)")
    scale_argument(train)
    train.add_argument("--scenes", type=positive_int, default=512, help="zoo scenes to regenerate (no --data)")
    train.add_argument("--text-steps", type=nonnegative_int, default=120)
    train.add_argument("--multimodal-steps", type=nonnegative_int, default=330)
    train.add_argument("--batch-size", type=positive_int, default=8)
    train.add_argument("--lr", type=float_range(0.0, low_open=True), default=1e-3)
    train.add_argument("--checkpoint-every", type=positive_int, default=50, help="steps between stage checkpoints")
    train.add_argument("--seed", type=nonnegative_int, default=0, help="seeds the head's initialisation and noise")
    add_job_options(train)
    train.add_argument("--device", type=device_arg, default=default_device())
    train.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    train.set_defaults(func=cmd_train_drafter)

    caption = sub.add_parser("caption", help="caption a folder of images with a VLM into a JSON-lines file")
    caption.add_argument("--target", required=True, help="local HF VLM folder with its processor")
    drafter = caption.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--drafter", help="specmm VisionDrafter folder, or 'prompt-lookup'")
    drafter.add_argument("--draft-lm", help="local HF folder of a small causal LM with the target's vocabulary")
    caption.add_argument("--images", required=True, help="a folder of images or a glob pattern")
    caption.add_argument("--out", required=True, help="output .jsonl file (one line per image)")
    caption.add_argument("--batch-size", type=positive_int, default=8)
    caption.add_argument("--max-new-tokens", type=positive_int, default=128)
    caption.add_argument("--temperature", type=temperature_arg, default=0.0, help="0 (default) is greedy")
    caption.add_argument("--prompt",
                         help="instruction (default: 'Describe the picture in detail.'), put in the processor's chat "
                         "template (the zoo captioner's is its training "
                         "format); a prompt holding the image token is sent as it is")
    job = caption.add_mutually_exclusive_group()
    job.add_argument("--resume", action="store_true", help="continue the same job in --out: skip images already in it")
    job.add_argument("--force", action="store_true", help="discard what --out holds and start over")
    caption.add_argument("--compile", action="store_true",
                         help="compiled mode: static caches and compiled forwards (identical captions); each new "
                         "batch shape compiles once, and the time spent compiling is printed apart")
    caption.add_argument("--device", type=device_arg, default=default_device())
    caption.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    caption.set_defaults(func=cmd_caption)


__all__ = ["add_parsers", "cmd_caption", "cmd_train_drafter"]
