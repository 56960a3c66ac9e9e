"""`specmm bench core|vlm|ssm|image_ar|cspd|dlm`: side-by-side benchmarks written as JSON + Markdown reports
(`bench reasoning` is registered by `specmm.cli.reason`)."""

from __future__ import annotations

import torch

import specmm
from specmm.cli.common import (
    local_path,
    scale_argument,
    command_line,
    default_device,
    device_arg,
    dtype_arg,
    dynamic_tree,
    fill_draft_defaults,
    float_range,
    int_range,
    latent_size_arg,
    loading,
    model_folder,
    nonnegative_int,
    positive_int,
    read_text_lines,
    report_lock,
    set_types,
    temperature_arg,
)


def cmd_bench(args) -> int:
    if args.bench_command == "vlm":
        return cmd_bench_vlm(args)
    if args.bench_command == "ssm":
        from specmm.bench import ssm as bench_ssm
        with report_lock(args.out, args.name or f"ssm-{args.scale}-{torch.device(args.device).type}"):
            return bench_ssm.run_command(args, command_line())
    if args.bench_command == "image_ar":
        from specmm.bench.image_ar import bench_image_ar
        return bench_image_ar(args)
    if args.bench_command == "cspd":
        return cmd_bench_cspd(args)
    if args.bench_command == "dlm":
        return cmd_bench_dlm(args)
    return cmd_bench_core(args)


def cmd_bench_core(args) -> int:
    if (args.random or args.target) and args.drafts != ["code"]:
        raise ValueError("--drafts: picks the zoo's drafters; with --target pass --draft and/or --eagle")
    if args.eagle and not args.target:
        raise ValueError("--eagle: needs --target (the zoo's EAGLE head is --drafts eagle)")
    device = torch.device(args.device)
    fill_draft_defaults(args)
    source = "random" if args.random else ("custom" if args.target else f"{args.zoo}-{args.scale}")
    name = args.name or f"core-{source}-{device.type}"
    with report_lock(args.out, name):
        return _bench_core(args, device, name)


def _bench_core(args, device, name) -> int:
    from specmm.bench import inputs as sources
    from specmm.bench.core import CoreBenchSetup, bench_core
    from specmm.drafters import EagleDrafter

    drafters = {}
    if args.random:
        data = sources.random_pair(args.batch_size, device, args.dtype)
    elif args.target:
        args.target = local_path(model_folder("--target", args.target))
        args.draft = local_path(model_folder("--draft", args.draft))
        args.eagle = local_path(model_folder("--eagle", args.eagle))
        if args.prompts:
            read_text_lines("--prompts", args.prompts)  # a missing or non-UTF-8 file is named before loading
        with loading("--target/--draft", f"{args.target} and {args.draft}"):
            data = sources.from_paths(args.target, args.draft, args.prompts, args.batch_size, device, args.dtype)
        if args.eagle:
            with loading("--eagle", args.eagle):
                eagle = EagleDrafter.from_pretrained(args.eagle, data.target)
            drafters["eagle"] = sources.eagle_factory(eagle, data.target)
            data.description["eagle"] = args.eagle
    else:
        data = sources.from_zoo(args.zoo, args.scale, args.batch_size, device, args.dtype)
        drafters = sources.zoo_code_drafters(data, args.drafts, args.scale, device, args.dtype)
    if args.no_repeat_ngram_size:  # HF generate (every baseline) and specmm's rows read it from the model
        data.target.generation_config.no_repeat_ngram_size = args.no_repeat_ngram_size
        data.description["no_repeat_ngram_size"] = args.no_repeat_ngram_size
    setup = CoreBenchSetup(max_new_tokens=args.max_new_tokens, k=args.k, lookup_k=args.lookup_k,
                           tree=dynamic_tree(args),
                           eos_token_id=data.eos_token_id, pad_token_id=data.pad_token_id, repeats=args.repeats,
                           warmup=args.warmup, modes=modes(args), trees=tuple(args.trees), lookup=not args.no_lookup,
                           profile=not args.no_profile)
    report, _ = bench_core(data.target, data.draft, data.input_ids, data.attention_mask, setup, command=command_line(),
                           models=data.description, notes=data.notes, drafters=drafters,
                           checkpoint=lambda partial: partial.write(args.out, name))
    return show_and_write(report, args.out, name, legend=True)


def cmd_bench_vlm(args) -> int:
    from specmm.vlm import METHODS

    methods = args.methods.split(",") if args.methods else list(METHODS)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    device = torch.device(args.device)
    name = args.name or f"vlm-captioner-{args.scale}-{device.type}"
    with report_lock(args.out, name):
        return _bench_vlm(args, methods, device, name)


def _bench_vlm(args, methods, device, name) -> int:
    from specmm import zoo
    from specmm.bench.vlm import VLMBenchSetup, bench_vlm, write_reports
    from specmm.vlm import VisionDrafter
    from specmm.zoo import captioner

    models = captioner.load(zoo.build("captioner", args.scale), device=device, dtype=args.dtype)
    drafters_dir = zoo.build("captioner-drafters", args.scale)
    drafters = {m: VisionDrafter.from_pretrained(drafters_dir / m, models.target) for m in methods}
    k, depth, top_k, total = (4, 3, 2, 6) if device.type == "cpu" else (4, 4, 4, 16)
    setup = VLMBenchSetup(scenes=args.scenes, batch_sizes=tuple(args.batch_sizes), max_new_tokens=args.max_new_tokens,
                          tree=specmm.TreeSpec.dynamic(depth=args.depth or depth, top_k=args.top_k or top_k,
                                                       total_tokens=args.total_tokens or total),
                          k=args.k or k, trees=tuple(args.trees), modes=modes(args),
                          temperatures=tuple(args.temperatures), repeats=args.repeats, warmup=args.warmup,
                          profile=not args.no_profile)
    record = zoo.record("captioner", args.scale)
    description = {"scale": args.scale, "target": f"zoo captioner-{args.scale} "
                   f"({record['models']['target']['parameters'] / 1e6:.2f}M params, {record['image_tokens']} image "
                   "tokens per image)", "drafters": f"zoo captioner-drafters-{args.scale}",
                   "draft LM (HF assisted)": f"{record['models']['draft']['parameters'] / 1e6:.2f}M params"}
    reports, _ = bench_vlm(models, drafters, setup, command=command_line(), description=description,
                           checkpoint=lambda partial: write_reports(partial, args.out, name))
    for report in reports:
        print(f"\n{report.name}\n{report.table()}")
    if reports:
        print(reports[0].legend())
    json_path, md_path = write_reports(reports, args.out, name)
    print(f"wrote {json_path} and {md_path}")
    return 0


def show_and_write(report, out, name: str, legend: bool = False) -> int:
    """Print a report's table (and its column legend), its notes, and write its Markdown and JSON."""
    print(report.table())
    if legend:
        print(report.legend())
    for note in report.notes:
        print("note:", note)
    json_path, md_path = report.write(out, name)
    print(f"wrote {json_path} and {md_path}")
    return 0


def modes(args) -> tuple[str, ...]:
    """specmm modes a benchmark runs: eager, and compiled too with --compile."""
    return ("eager", "compiled") if getattr(args, "compile", False) else ("eager",)


NO_PROFILE_HELP = ("skip each specmm row's extra profiled run (the per-round time split): a compiled row's profiled "
                   "run compiles every part on its own, which on a GPU costs about as much as the row's own compile")
COMPILE_HELP = ("also run HF generate with a static cache + torch.compile (a baseline) and every specmm row in "
                "compiled mode (static caches, compiled forwards); compile time is measured in the warm-up and "
                "reported apart")


WARMUP_HELP = ("untimed runs of every method before the timed ones (compiled rows compile here; raise it if a "
               "report warns of compile events during timed runs)")


def cmd_bench_cspd(args) -> int:
    from specmm.bench.cspd import CSpDBenchSetup

    setup = CSpDBenchSetup(images=args.images, batch_size=args.batch_size, draft_tokens=tuple(args.k),
                           rules=tuple(args.rules), prefill_tokens=args.prefill_tokens,
                           temperature=args.temperature, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                           compile_heads=args.compile_heads)
    device = torch.device(args.device)
    name = args.name or f"cspd-{args.scale}-{device.type}"
    with report_lock(args.out, name):
        return _bench_cspd(args, setup, device, name)


def _bench_cspd(args, setup, device, name) -> int:
    from pathlib import Path

    from specmm import zoo
    from specmm.bench.cspd import bench_cspd
    from specmm.zoo import cspd

    models = cspd.load(zoo.build("cspd", args.scale), device)
    record = zoo.record("cspd", args.scale)
    description = {"zoo": f"cspd-{args.scale}", "latent tokens per image": models["target"].config.num_tokens,
                   "token dim": models["target"].config.token_dim,
                   "denoising steps": models["target"].config.diffusion_steps,
                   "target params": record["target"]["parameters"], "draft params": record["draft"]["parameters"],
                   "FID/KID features": f"timm {record['classifier']['model']} trained on the class images "
                   f"(held-out accuracy {record['classifier']['heldout_accuracy']:.2f})"}
    report, _ = bench_cspd(models, setup, command=command_line(), description=description,
                           grid_path=Path(args.out) / f"{name}-grid.png",
                           checkpoint=lambda partial: partial.write(args.out, name))
    return show_and_write(report, args.out, name)


def cmd_bench_dlm(args) -> int:
    from specmm.bench.dlm import DLMBenchSetup, bench_dlm_zoo

    if set(args.caches) - {"none", "prefix"}:
        raise ValueError(f"--caches: expected none and/or prefix, got {args.caches}")
    setup = DLMBenchSetup(prompts=args.prompts, batch_size=args.batch_size, gen_length=args.gen_length,
                          block_length=args.block_length, draft_size=args.draft_size, tree_width=args.tree_width,
                          caches=tuple(None if c == "none" else c for c in args.caches), repeats=args.repeats,
                          warmup=args.warmup)
    device = torch.device(args.device)
    name = args.name or f"dlm-code-{args.scale}-{device.type}"
    with report_lock(args.out, name):
        reports, paths = bench_dlm_zoo(args.scale, setup, device, args.dtype, command=command_line(), out=args.out,
                                       name=name)
    for report in reports:
        print(f"\n{report.name}\n{report.table()}")
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


def add_parser(sub):
    """Register `bench` and its core/vlm/ssm/image_ar/cspd/dlm subcommands; returns the bench subparsers."""
    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    core = bsub.add_parser("core", help="HF generate (eager, static+compiled) vs HF assisted vs specmm chain / tree / "
                           "prompt lookup, eager and compiled")
    source = core.add_mutually_exclusive_group()
    source.add_argument("--zoo", default="code", help="zoo entry to benchmark on (default: code)")
    source.add_argument("--target", help="local HF causal LM folder (with --draft)")
    source.add_argument("--random", action="store_true", help="random weights: checks machinery, not speed")
    core.add_argument("--draft", help="local HF folder of a smaller LM with the same vocabulary")
    core.add_argument("--eagle", help="local folder of an EAGLE-1/2 head for --target (specmm's save_pretrained or an "
                      "upstream checkpoint): adds EAGLE chain and tree rows")
    core.add_argument("--drafts", nargs="+", default=["code"], choices=["code", "eagle", "distilled"],
                      help="zoo drafters with a chain and a tree row each: code (the code entry's draft, with HF "
                      "assisted), eagle (an EAGLE head on the target), distilled (the code draft distilled onto the "
                      "target); eagle and distilled come from zoo code-drafts, built on first use (~10 min on CPU)")
    core.add_argument("--prompts", help="text file, one prompt per line (with --target)")
    scale_argument(core)
    core.add_argument("--device", type=device_arg, default=default_device())
    core.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    core.add_argument("--batch-size", type=positive_int, default=4)
    core.add_argument("--max-new-tokens", type=positive_int, default=128)
    core.add_argument("--no-repeat-ngram-size", type=positive_int,
                      help="set on the target's generation_config (HF generate and every specmm row honour it): "
                      "greedy output without repeated n-grams, i.e. without loops")
    core.add_argument("--k", type=positive_int, help="chain length (default: 2 on CPU, 4 on CUDA)")
    core.add_argument("--lookup-k", type=positive_int, default=8,
                      help="prompt lookup's draft length (default 8: copied drafts cost no forwards)")
    core.add_argument("--trees", nargs="+", choices=["chain", "dynamic"], default=["chain", "dynamic"],
                      help="specmm rows per drafter: a chain of --k tokens and/or the dynamic tree")
    core.add_argument("--no-lookup", action="store_true", help="leave out the prompt lookup rows")
    core.add_argument("--no-profile", action="store_true", help=NO_PROFILE_HELP)
    core.add_argument("--depth", type=positive_int, help="dynamic tree depth (default: 3 on CPU, 5 on CUDA)")
    core.add_argument("--top-k", type=positive_int, help="dynamic tree branching (default: 2 on CPU, 4 on CUDA)")
    core.add_argument("--total-tokens", type=int_range(2),
                      help="dynamic tree nodes incl. root (default: 8 on CPU, 24 on CUDA)")
    core.add_argument("--repeats", type=positive_int, default=3)
    core.add_argument("--warmup", type=positive_int, default=1, help=WARMUP_HELP)
    core.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    core.add_argument("--out", default="benchmarks")
    core.add_argument("--name", help="report file stem (default core-<source>-<device>)")
    vlm = bsub.add_parser("vlm", help="captioning: HF generate (eager, static+compiled) vs HF assisted vs every "
                          "VisionDrafter method, eager and compiled")
    scale_argument(vlm, help="zoo scale of the captioner and its drafters")
    vlm.add_argument("--methods", help="comma-separated subset of eagle,msd,vispec,dream,flash (default: all)")
    vlm.add_argument("--scenes", type=positive_int, default=8)
    vlm.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8])
    vlm.add_argument("--temperatures", type=temperature_arg, nargs="+", default=[0.0, 1.0])
    vlm.add_argument("--max-new-tokens", type=positive_int, default=160)
    vlm.add_argument("--trees", nargs="+", choices=["chain", "dynamic"], default=["chain", "dynamic"],
                     help="specmm rows per drafter: a chain of --k tokens and/or the dynamic tree")
    vlm.add_argument("--k", type=positive_int, help="chain length (default: 4)")
    vlm.add_argument("--depth", type=positive_int, help="dynamic tree depth (default: 3 on CPU, 4 on CUDA)")
    vlm.add_argument("--top-k", type=positive_int, help="dynamic tree branching (default: 2 on CPU, 4 on CUDA)")
    vlm.add_argument("--total-tokens", type=int_range(2),
                     help="dynamic tree nodes incl. root (default: 6 on CPU, 16 on CUDA)")
    vlm.add_argument("--repeats", type=positive_int, default=3)
    vlm.add_argument("--warmup", type=positive_int, default=1, help=WARMUP_HELP)
    vlm.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    vlm.add_argument("--no-profile", action="store_true", help=NO_PROFILE_HELP)
    vlm.add_argument("--device", type=device_arg, default=default_device())
    vlm.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    vlm.add_argument("--out", default="benchmarks")
    vlm.add_argument("--name", help="report file stem (default vlm-captioner-<scale>-<device>)")
    from specmm.bench import ssm as bench_ssm
    bench_ssm.add_parser(bsub, positive_int)
    set_types(bsub.choices["ssm"], {"device": device_arg})
    from specmm.bench.image_ar import add_parser as add_bench_image_ar
    add_bench_image_ar(bsub)
    set_types(bsub.choices["image_ar"], {
        "images": positive_int, "batch_sizes": positive_int, "cfg_scale": float_range(1.0), "top_k": nonnegative_int,
        "temperature": temperature_arg,
        "window": int_range(2), "delta": float_range(0.0, 1.0), "lam": float_range(1.0), "lantern_k": positive_int,
        "lantern_pp_k": positive_int, "draft_chain": positive_int, "gsd_window": positive_int,
        "gsd_gap": float_range(0.0, 1.0), "gsd_quantile": float_range(0.0, 1.0), "seed": nonnegative_int,
        "latent_size": latent_size_arg, "device": device_arg, "repeats": positive_int, "dtype": dtype_arg})
    cs = bsub.add_parser("cspd", help="continuous-token AR: target alone vs CSpD (zoo cspd), FID/KID vs noise floor")
    scale_argument(cs)
    cs.add_argument("--images", type=positive_int, default=200)
    cs.add_argument("--batch-size", type=positive_int, default=50)
    cs.add_argument("--k", type=positive_int, nargs="+", default=[4],
                    help="draft tokens per round (several: one row each)")
    cs.add_argument("--rules", nargs="+", default=["trajectory", "final-step"], help="trajectory | final-step")
    cs.add_argument("--prefill-tokens", type=nonnegative_int, default=0,
                    help="first tokens generated by the target alone")
    cs.add_argument("--temperature", type=float_range(0.0, low_open=True), default=1.0)
    cs.add_argument("--repeats", type=positive_int, default=1)
    cs.add_argument("--warmup", type=nonnegative_int, default=0)
    cs.add_argument("--seed", type=nonnegative_int, default=0)
    cs.add_argument("--compile-heads", action="store_true",
                    help="torch.compile the denoising chains of target and draft (every row alike; compiled untimed)")
    cs.add_argument("--device", type=device_arg, default=default_device())
    cs.add_argument("--out", default="benchmarks")
    cs.add_argument("--name", help="report file stem (default cspd-<scale>-<device>)")
    dlm = bsub.add_parser("dlm", help="diffusion LM: stepwise vs SSD vs lossy parallel decoders (zoo dlm-code)")
    scale_argument(dlm)
    dlm.add_argument("--prompts", type=positive_int, default=16)
    dlm.add_argument("--batch-size", type=positive_int, default=4)
    dlm.add_argument("--gen-length", type=positive_int, default=64)
    dlm.add_argument("--block-length", type=positive_int, default=16)
    dlm.add_argument("--draft-size", type=positive_int, default=8)
    dlm.add_argument("--tree-width", type=positive_int, default=3)
    dlm.add_argument("--caches", nargs="+", default=["none", "prefix"], help="none and/or prefix")
    dlm.add_argument("--repeats", type=positive_int, default=3)
    dlm.add_argument("--warmup", type=nonnegative_int, default=1)
    dlm.add_argument("--device", type=device_arg, default=default_device())
    dlm.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    dlm.add_argument("--out", default="benchmarks")
    dlm.add_argument("--name", help="report file stem (default dlm-code-<scale>-<device>)")
    bench.set_defaults(func=cmd_bench)
    return bsub


__all__ = ["add_parser", "cmd_bench"]
