"""The `specmm` command: `demo`, `zoo list|build|path`, `bench core|vlm|ssm|image_ar|cspd|dlm|reasoning`, `caption`,
`train-drafter`, `sample-images`, `sample-continuous`, `reason`."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

import torch

import specmm


def _dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(table)}")
    return table[name]


# Draft shapes that pay on each device: on CPU a draft forward costs ~0.2 target forwards (framework overhead
# of tiny models), so drafts stay short; on a GPU verification of 24 nodes costs about one decode step.
DRAFT_DEFAULTS = {"cpu": dict(k=2, depth=3, top_k=2, total_tokens=8),
                  "cuda": dict(k=4, depth=5, top_k=4, total_tokens=24)}


def _fill_draft_defaults(args) -> None:
    defaults = DRAFT_DEFAULTS.get(torch.device(args.device).type, DRAFT_DEFAULTS["cuda"])
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def _tree(args) -> specmm.TreeSpec:
    return specmm.TreeSpec.dynamic(depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens)


def cmd_zoo(args) -> int:
    from specmm import zoo

    if args.zoo_command == "list":
        for entry in zoo.REGISTRY.values():
            built = [scale for scale in entry.recipes if zoo.is_built(entry.name, scale)]
            print(f"{entry.name:<19} scales: {', '.join(entry.recipes):<16} built: {', '.join(built) or '-':<10} "
                  f"{entry.description}")
    elif args.zoo_command == "build":
        path = zoo.build(args.name, args.scale, seed=args.seed, force=args.force)
        record = zoo.record(args.name, args.scale)
        print(json.dumps({k: v for k, v in record.items() if k not in ("files", "recipe")}, indent=2))
        print(path)
    else:
        print(zoo.path(args.name, args.scale))
    return 0


def cmd_bench(args) -> int:
    if args.bench_command == "vlm":
        return cmd_bench_vlm(args)
    if args.bench_command == "ssm":
        from specmm.bench import ssm as bench_ssm
        return bench_ssm.run_command(args, "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    if args.bench_command == "image_ar":
        from specmm.bench.image_ar import bench_image_ar
        return bench_image_ar(args)
    if args.bench_command == "cspd":
        return cmd_bench_cspd(args)
    if args.bench_command == "dlm":
        return cmd_bench_dlm(args)
    from specmm.bench import inputs as sources
    from specmm.bench.core import CoreBenchSetup, bench_core

    device = torch.device(args.device)
    _fill_draft_defaults(args)
    if args.random:
        data, source = sources.random_pair(args.batch_size, device, args.dtype), "random"
    elif args.target:
        data, source = sources.from_paths(args.target, args.draft, args.prompts, args.batch_size, device,
                                          args.dtype), "custom"
    else:
        data, source = sources.from_zoo(args.zoo, args.scale, args.batch_size, device, args.dtype), \
            f"{args.zoo}-{args.scale}"
    setup = CoreBenchSetup(max_new_tokens=args.max_new_tokens, k=args.k, tree=_tree(args),
                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id, repeats=args.repeats)
    command = "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report, _ = bench_core(data.target, data.draft, data.input_ids, data.attention_mask, setup, command=command,
                           models=data.description, notes=data.notes)
    print(report.table())
    for note in report.notes:
        print("note:", note)
    name = args.name or f"core-{source}-{device.type}"
    json_path, md_path = report.write(args.out, name)
    print(f"wrote {json_path} and {md_path}")
    return 0


def cmd_bench_vlm(args) -> int:
    from specmm import zoo
    from specmm.bench.vlm import VLMBenchSetup, bench_vlm, write_reports
    from specmm.vlm import METHODS, VisionDrafter
    from specmm.zoo import captioner

    methods = args.methods.split(",") if args.methods else list(METHODS)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    device = torch.device(args.device)
    models = captioner.load(zoo.build("captioner", args.scale), device=device, dtype=args.dtype)
    drafters_dir = zoo.build("captioner-drafters", args.scale)
    drafters = {m: VisionDrafter.from_pretrained(drafters_dir / m, models.target) for m in methods}
    depth, top_k, total = (3, 2, 6) if device.type == "cpu" else (4, 4, 16)
    setup = VLMBenchSetup(scenes=args.scenes, batch_sizes=tuple(args.batch_sizes), max_new_tokens=args.max_new_tokens,
                          tree=specmm.TreeSpec.dynamic(depth=args.depth or depth, top_k=args.top_k or top_k,
                                                       total_tokens=args.total_tokens or total),
                          temperatures=tuple(args.temperatures), repeats=args.repeats)
    record = zoo.record("captioner", args.scale)
    description = {"scale": args.scale, "target": f"zoo captioner-{args.scale} "
                   f"({record['models']['target']['parameters'] / 1e6:.2f}M params, {record['image_tokens']} image "
                   "tokens per image)", "drafters": f"zoo captioner-drafters-{args.scale}",
                   "draft LM (HF assisted)": f"{record['models']['draft']['parameters'] / 1e6:.2f}M params"}
    command = "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    reports, _ = bench_vlm(models, drafters, setup, command=command, description=description)
    for report in reports:
        print(f"\n{report.name}\n{report.table()}")
    json_path, md_path = write_reports(reports, args.out, args.name or f"vlm-captioner-{args.scale}-{device.type}")
    print(f"wrote {json_path} and {md_path}")
    return 0


def cmd_bench_cspd(args) -> int:
    from pathlib import Path

    from specmm import zoo
    from specmm.bench.cspd import CSpDBenchSetup, bench_cspd
    from specmm.zoo import cspd

    setup = CSpDBenchSetup(images=args.images, batch_size=args.batch_size, draft_tokens=tuple(args.k),
                           rules=tuple(args.rules), prefill_tokens=args.prefill_tokens,
                           temperature=args.temperature, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                           compile_heads=args.compile_heads)
    device = torch.device(args.device)
    models = cspd.load(zoo.build("cspd", args.scale), device)
    record = zoo.record("cspd", args.scale)
    description = {"zoo": f"cspd-{args.scale}", "latent tokens per image": models["target"].config.num_tokens,
                   "token dim": models["target"].config.token_dim,
                   "denoising steps": models["target"].config.diffusion_steps,
                   "target params": record["target"]["parameters"], "draft params": record["draft"]["parameters"],
                   "FID/KID features": f"timm {record['classifier']['model']} trained on the class images "
                   f"(held-out accuracy {record['classifier']['heldout_accuracy']:.2f})"}
    name = args.name or f"cspd-{args.scale}-{device.type}"
    command = "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report, _ = bench_cspd(models, setup, command=command, description=description,
                           grid_path=Path(args.out) / f"{name}-grid.png")
    print(report.table())
    for note in report.notes:
        print("note:", note)
    json_path, md_path = report.write(args.out, name)
    print(f"wrote {json_path} and {md_path}")
    return 0


def cmd_bench_dlm(args) -> int:
    from specmm.bench.dlm import DLMBenchSetup, bench_dlm_zoo

    if set(args.caches) - {"none", "prefix"}:
        raise ValueError(f"--caches: expected none and/or prefix, got {args.caches}")
    setup = DLMBenchSetup(prompts=args.prompts, batch_size=args.batch_size, gen_length=args.gen_length,
                          block_length=args.block_length, draft_size=args.draft_size, tree_width=args.tree_width,
                          caches=tuple(None if c == "none" else c for c in args.caches), repeats=args.repeats,
                          warmup=args.warmup)
    command = "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    reports, paths = bench_dlm_zoo(args.scale, setup, torch.device(args.device), args.dtype, command=command,
                                   out=args.out, name=args.name)
    for report in reports:
        print(f"\n{report.name}\n{report.table()}")
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


def cmd_train_drafter(args) -> int:
    from specmm import zoo
    from specmm.vlm import DrafterTrainConfig, VisionDrafter, train_drafter
    from specmm.vlm.train import jsonl_batches
    from specmm.zoo import captioner, captioner_drafters

    device = torch.device(args.device)
    if args.target:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        target = AutoModelForImageTextToText.from_pretrained(args.target, dtype=args.dtype,
                                                             attn_implementation="sdpa").to(device).eval()
        processor = AutoProcessor.from_pretrained(args.target)
    else:
        models = captioner.load(zoo.build("captioner", args.scale), device=device, dtype=args.dtype)
        target, processor = models.target, models.processor
    if args.data:
        batches = jsonl_batches(args.data, processor, args.prompt, args.batch_size)
    elif args.target:
        raise ValueError("--data: a captions .jsonl (e.g. from `specmm caption`) is needed with --target")
    else:
        pairs = captioner_drafters.regenerated_captions(models, args.scenes, 220, _mkdir(args.out))
        batches = captioner_drafters.caption_batches(models, pairs, args.batch_size)
    drafter = (VisionDrafter.from_pretrained(args.init, target) if args.init
               else VisionDrafter.for_target(target, method=args.method))
    for stage, steps in (("text", args.text_steps), ("multimodal", args.multimodal_steps)):
        if steps:
            config = DrafterTrainConfig(steps=steps, lr=args.lr)
            losses = train_drafter(target, processor, drafter, batches, config, stage=stage,
                                   checkpoint_dir=f"{args.out}/{stage}")
            if losses:
                print(f"{stage}: final loss {sum(losses[-10:]) / len(losses[-10:]):.4f}")
    drafter.save_pretrained(args.out)
    print(f"saved the {drafter.method} drafter to {args.out}")
    return 0


def _mkdir(path: str):
    from pathlib import Path

    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


def cmd_demo(args) -> int:
    from specmm.demo import run_demo

    run_demo(scale=args.scale, out=args.out, device=args.device, build_all=args.all)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def cmd_caption(args) -> int:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from specmm.drafters import ModelDrafter, PromptLookupDrafter
    from specmm.vlm import SpeculativeVLM, caption_images, find_images
    from specmm.vlm.caption import DEFAULT_PROMPT, check_output

    paths = find_images(args.images)  # cheap errors before any model is loaded
    check_output(args.out, args.resume)
    sampling = specmm.SamplingConfig(temperature=args.temperature)
    device = torch.device(args.device)
    load = dict(dtype=args.dtype, attn_implementation="sdpa")
    target = AutoModelForImageTextToText.from_pretrained(args.target, **load).to(device).eval()
    processor = AutoProcessor.from_pretrained(args.target)
    draft = DRAFT_DEFAULTS.get(device.type, DRAFT_DEFAULTS["cuda"])
    tree = specmm.TreeSpec.dynamic(depth=draft["depth"], top_k=draft["top_k"], total_tokens=draft["total_tokens"])
    if args.draft_lm:
        drafter = ModelDrafter(AutoModelForCausalLM.from_pretrained(args.draft_lm, **load).to(device).eval())
    elif args.drafter == "prompt-lookup":
        drafter, tree = PromptLookupDrafter(ngram=3, k=8), specmm.TreeSpec.chain(8)
    else:
        try:
            from specmm.vlm import VisionDrafter
        except ImportError:
            raise ValueError(f"--drafter {args.drafter}: a drafter folder needs specmm.vlm.VisionDrafter, which "
                             "this install lacks; use --drafter prompt-lookup or --draft-lm DIR") from None
        drafter = VisionDrafter.from_pretrained(args.drafter, target)
    svlm = SpeculativeVLM(target, processor, drafter, tree=tree)
    summary = caption_images(svlm, paths, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                             resume=args.resume, sampling=sampling, prompt=args.prompt or DEFAULT_PROMPT)
    done = summary.caption
    print(f"captioned {done.captioned}, skipped {done.skipped}, unreadable {done.errors}; "
          f"{summary.new_tokens} tokens, mean accepted {summary.mean_accepted:.2f}, {summary.wall_time_s:.1f} s "
          f"-> {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specmm", description=specmm.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="build the reference models if needed and run the main job side by side")
    demo.add_argument("--scale", default="cpu")
    demo.add_argument("--all", action="store_true",
                      help="also build (once) and run every section whose zoo entries are not built yet")
    demo.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    demo.add_argument("--out", default="demo_report.html")
    demo.set_defaults(func=cmd_demo)

    zoo = sub.add_parser("zoo", help="reference models specmm trains itself")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zsub.add_parser("list")
    for name in ("build", "path"):
        p = zsub.add_parser(name)
        p.add_argument("name")
        p.add_argument("--scale", default="cpu")
        if name == "build":
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--force", action="store_true", help="discard any existing build and start over")
    zoo.set_defaults(func=cmd_zoo)

    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    core = bsub.add_parser("core", help="target-only vs HF assisted vs specmm chain / tree / prompt lookup")
    source = core.add_mutually_exclusive_group()
    source.add_argument("--zoo", default="code", help="zoo entry to benchmark on (default: code)")
    source.add_argument("--target", help="local HF causal LM folder (with --draft)")
    source.add_argument("--random", action="store_true", help="random weights: checks machinery, not speed")
    core.add_argument("--draft", help="local HF folder of a smaller LM with the same vocabulary")
    core.add_argument("--prompts", help="text file, one prompt per line (with --target)")
    core.add_argument("--scale", default="cpu")
    core.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    core.add_argument("--dtype", type=_dtype, default=torch.float32)
    core.add_argument("--batch-size", type=int, default=4)
    core.add_argument("--max-new-tokens", type=int, default=128)
    core.add_argument("--k", type=int, help="chain length (default: 2 on CPU, 4 on CUDA)")
    core.add_argument("--depth", type=int, help="dynamic tree depth (default: 3 on CPU, 5 on CUDA)")
    core.add_argument("--top-k", type=int, help="dynamic tree branching (default: 2 on CPU, 4 on CUDA)")
    core.add_argument("--total-tokens", type=int, help="dynamic tree nodes incl. root (default: 8 on CPU, 24 on CUDA)")
    core.add_argument("--repeats", type=int, default=3)
    core.add_argument("--out", default="benchmarks")
    core.add_argument("--name", help="report file stem (default core-<source>-<device>)")
    vlm = bsub.add_parser("vlm", help="captioning: target-only vs HF assisted vs every VisionDrafter method")
    vlm.add_argument("--scale", default="cpu", help="zoo scale of the captioner and its drafters")
    vlm.add_argument("--methods", help="comma-separated subset of eagle,msd,vispec,dream,flash (default: all)")
    vlm.add_argument("--scenes", type=_positive_int, default=8)
    vlm.add_argument("--batch-sizes", type=_positive_int, nargs="+", default=[1, 8])
    vlm.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    vlm.add_argument("--max-new-tokens", type=_positive_int, default=160)
    vlm.add_argument("--depth", type=int)
    vlm.add_argument("--top-k", type=int)
    vlm.add_argument("--total-tokens", type=int)
    vlm.add_argument("--repeats", type=_positive_int, default=3)
    vlm.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    vlm.add_argument("--dtype", type=_dtype, default=torch.float32)
    vlm.add_argument("--out", default="benchmarks")
    vlm.add_argument("--name", help="report file stem (default vlm-captioner-<scale>-<device>)")
    from specmm.bench import ssm as bench_ssm
    bench_ssm.add_parser(bsub, _positive_int)
    from specmm.bench.image_ar import add_parser as add_bench_image_ar
    add_bench_image_ar(bsub)
    cs = bsub.add_parser("cspd", help="continuous-token AR: target alone vs CSpD (zoo cspd), FID/KID vs noise floor")
    cs.add_argument("--scale", default="cpu")
    cs.add_argument("--images", type=_positive_int, default=200)
    cs.add_argument("--batch-size", type=_positive_int, default=50)
    cs.add_argument("--k", type=_positive_int, nargs="+", default=[4], help="draft tokens per round (several: one row each)")
    cs.add_argument("--rules", nargs="+", default=["trajectory", "final-step"], help="trajectory | final-step")
    cs.add_argument("--prefill-tokens", type=int, default=0, help="first tokens generated by the target alone")
    cs.add_argument("--temperature", type=float, default=1.0)
    cs.add_argument("--repeats", type=_positive_int, default=1)
    cs.add_argument("--warmup", type=int, default=0)
    cs.add_argument("--seed", type=int, default=0)
    cs.add_argument("--compile-heads", action="store_true",
                    help="torch.compile the denoising chains of target and draft (every row alike; compiled untimed)")
    cs.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    cs.add_argument("--out", default="benchmarks")
    cs.add_argument("--name", help="report file stem (default cspd-<scale>-<device>)")
    dlm = bsub.add_parser("dlm", help="diffusion LM: stepwise vs SSD vs lossy parallel decoders (zoo dlm-code)")
    dlm.add_argument("--scale", default="cpu")
    dlm.add_argument("--prompts", type=_positive_int, default=16)
    dlm.add_argument("--batch-size", type=_positive_int, default=4)
    dlm.add_argument("--gen-length", type=_positive_int, default=64)
    dlm.add_argument("--block-length", type=_positive_int, default=16)
    dlm.add_argument("--draft-size", type=_positive_int, default=8)
    dlm.add_argument("--tree-width", type=_positive_int, default=3)
    dlm.add_argument("--caches", nargs="+", default=["none", "prefix"], help="none and/or prefix")
    dlm.add_argument("--repeats", type=_positive_int, default=3)
    dlm.add_argument("--warmup", type=int, default=1)
    dlm.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    dlm.add_argument("--dtype", type=_dtype, default=torch.float32)
    dlm.add_argument("--out", default="benchmarks")
    dlm.add_argument("--name", help="report file stem (default dlm-code-<scale>-<device>)")
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train-drafter", help="train a VisionDrafter against a VLM by online distillation")
    train.add_argument("--method", default="vispec", help="eagle | msd | vispec | dream | flash")
    train.add_argument("--target", help="local HF VLM folder (default: the zoo captioner)")
    train.add_argument("--data", help="captions .jsonl with image and caption fields (e.g. `specmm caption` output "
                       "of the target itself: ViSpec's regeneration recipe)")
    train.add_argument("--prompt", default="Describe the picture in detail.", help="instruction used with --data")
    train.add_argument("--init", help="start from this drafter folder (e.g. a text-stage checkpoint)")
    train.add_argument("--out", required=True, help="output folder (checkpoints under OUT/text, OUT/multimodal)")
    train.add_argument("--scale", default="cpu")
    train.add_argument("--scenes", type=_positive_int, default=512, help="zoo scenes to regenerate (no --data)")
    train.add_argument("--text-steps", type=int, default=120)
    train.add_argument("--multimodal-steps", type=int, default=330)
    train.add_argument("--batch-size", type=_positive_int, default=8)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    train.add_argument("--dtype", type=_dtype, default=torch.float32)
    train.set_defaults(func=cmd_train_drafter)

    caption = sub.add_parser("caption", help="caption a folder of images with a VLM into a JSON-lines file")
    caption.add_argument("--target", required=True, help="local HF VLM folder with its processor")
    drafter = caption.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--drafter", help="specmm VisionDrafter folder, or 'prompt-lookup'")
    drafter.add_argument("--draft-lm", help="local HF folder of a small causal LM with the target's vocabulary")
    caption.add_argument("--images", required=True, help="a folder of images or a glob pattern")
    caption.add_argument("--out", required=True, help="output .jsonl file (one line per image)")
    caption.add_argument("--batch-size", type=_positive_int, default=8)
    caption.add_argument("--max-new-tokens", type=_positive_int, default=128)
    caption.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    caption.add_argument("--prompt", help="instruction (default: specmm.vlm.caption.DEFAULT_PROMPT); the "
                         "processor's image token is prepended when absent")
    caption.add_argument("--resume", action="store_true", help="skip images already in --out")
    caption.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    caption.add_argument("--dtype", type=_dtype, default=torch.float32)
    caption.set_defaults(func=cmd_caption)
    from specmm.image_ar.cli import add_parser as add_sample_images
    add_sample_images(sub)
    from specmm.image_ar.continuous.cli import add_parser as add_sample_continuous
    add_sample_continuous(sub)

    from specmm.reasoning.cli import add_parsers as add_reasoning_parsers  # `reason`, `bench reasoning`

    add_reasoning_parsers(sub, bsub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specmm: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
