"""`specmm sample-continuous`: class-conditional images from a continuous-token AR model, alone or with CSpD and a
draft. The output folder is a job like `sample-images`' (manifest, lock, atomic PNGs); each batch draws from one
generator seeded by its first image, so batches are fixed slices of the job and the batch size is part of the
manifest: a resumed job re-samples whole batches and gets exactly the images of an uninterrupted run."""

from __future__ import annotations

import torch

from specmm.cli.common import float_range, loading, model_folder, nonnegative_int, positive_int, local_path
from specmm.cli.images import (
    ImagesBar,
    add_job_arguments,
    finish_job,
    image_job,
    image_path,
    image_seed,
    parse_classes,
    plan_job,
    save_batch,
)


def cmd_sample_continuous(args) -> int:
    from diffusers import AutoencoderKL

    from specmm.image_ar.continuous import (
        ContinuousAR,
        CSpDSampler,
        compile_chain,
        sample_ar,
    )
    from specmm.image_ar.continuous.latents import decode
    from specmm.image_ar.images import to_pil
    from specmm.jobs import fingerprint
    from specmm.jobs.job import check_output_path
    from specmm.jobs.shards import Processes, process_device, shared_job

    out = check_output_path(args.out, "--out", folder=True)
    device = process_device(args.device)  # under `accelerate launch`: this process's GPU
    args.target = local_path(model_folder("--target", args.target))
    args.vae = local_path(model_folder("--vae", args.vae))
    args.draft = local_path(model_folder("--draft", args.draft))
    with loading("--target", args.target):
        target = ContinuousAR.from_pretrained(args.target, device)
    classes = parse_classes(args.classes, target.config.num_classes)
    with loading("--vae", args.vae, "VAE"):
        vae = AutoencoderKL.from_pretrained(args.vae).to(device).eval()
    sampler = None
    if args.draft:
        with loading("--draft", args.draft):
            draft = ContinuousAR.from_pretrained(args.draft, device)
        sampler = CSpDSampler(target, draft, draft_tokens=args.k, rule=args.rule, prefill_tokens=args.prefill_tokens)
    if args.compile_heads:
        for model in (target, draft) if sampler else (target,):
            compile_chain(model.head)

    method = f"cspd {args.rule} k={args.k}" if sampler else "ar"
    settings = {"method": method, "seed": args.seed, "temperature": args.temperature, "batch_size": args.batch_size,
                "target": fingerprint(args.target), "vae": fingerprint(args.vae)}
    if sampler:
        settings.update(draft=fingerprint(args.draft), prefill_tokens=args.prefill_tokens)
    processes = Processes(cpu=device.type == "cpu")
    with shared_job(image_job(args, "sample-continuous", settings), processes):
        # the plan of the main process (what is on disk before anyone writes), the same on every process
        jobs, todo = processes.share(plan_job(out, classes, args.per_class, args.batch_size)
                                     if processes.is_main else None)
        forwards = tokens = drafted = accepted = written = 0
        with ImagesBar(out, sum(len(b) for b in todo), f"sample-continuous {method}", processes) as bar:
            for batch in processes.my_share(todo):
                # one generator per batch (the sampler draws for all rows at once): seeded by its first image
                gen = torch.Generator(device=device).manual_seed(image_seed(args.seed, *batch[0]))
                labels = torch.tensor([c for c, _ in batch], device=device)
                if sampler:
                    result = sampler.sample(labels, temperature=args.temperature, generator=gen)
                else:
                    result = sample_ar(target, labels, temperature=args.temperature, generator=gen)
                written += save_batch(out, batch, to_pil(decode(vae, result.tokens)))
                forwards += result.stats.row_forwards
                tokens += result.stats.new_tokens
                drafted += result.stats.continuous.drafted
                accepted += result.stats.continuous.accepted
                bar.advance(len(batch))
        processes.barrier()
        written, forwards, tokens, drafted, accepted = (
            sum(c) for c in zip(*processes.gather((written, forwards, tokens, drafted, accepted))))
        summary = {"method": method, "settings": settings, "images": len(jobs), "sampled_now": written,
                   "mean_accepted_now": tokens / forwards if forwards else None,
                   "acceptance_rate_now": accepted / drafted if drafted else None}
        if processes.is_main:
            finish_job(out, [image_path(out, *job) for job in jobs], args.per_class, summary, "mean_accepted_now")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("sample-continuous",
                       help="sample images from a continuous-token AR model (ContinuousAR folder); CSpD if --draft")
    p.add_argument("--target", required=True, help="ContinuousAR folder (config.json + model.safetensors)")
    p.add_argument("--draft", help="smaller ContinuousAR folder of the same family: sample with CSpD")
    p.add_argument("--vae", required=True, help="diffusers AutoencoderKL folder (its config has the scaling factor)")
    p.add_argument("--classes", required=True, help="comma-separated class ids, e.g. 0,3")
    p.add_argument("--per-class", type=positive_int, default=4)
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per CSpD round")
    p.add_argument("--rule", default="final-step", choices=["final-step", "trajectory"],
                   help="final-step: the paper's test; trajectory: exact for any number of denoising steps")
    p.add_argument("--prefill-tokens", type=nonnegative_int, default=0,
                   help="first tokens generated by the target alone")
    p.add_argument("--temperature", type=float_range(0.0, low_open=True), default=1.0,
                   help="scales every denoising std (> 0)")
    p.add_argument("--compile-heads", action="store_true", help="torch.compile the denoising chains")
    add_job_arguments(p, batch_size=16)
    p.set_defaults(func=cmd_sample_continuous)


__all__ = ["add_parser", "cmd_sample_continuous"]
