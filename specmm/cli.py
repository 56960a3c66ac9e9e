"""The `specmm` command: `demo`, `zoo list|build|path`, `bench core`."""

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
            built = []
            for scale in entry.recipes:
                try:
                    zoo.path(entry.name, scale)
                    built.append(scale)
                except FileNotFoundError:
                    pass
            print(f"{entry.name:<12} scales: {', '.join(entry.recipes):<16} built: {', '.join(built) or '-':<10} "
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


def cmd_demo(args) -> int:
    from specmm.demo import run_demo

    run_demo(scale=args.scale, batch=args.batch_size, max_new_tokens=args.max_new_tokens, out=args.out,
             device=args.device)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specmm", description=specmm.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="build the reference models if needed and run the main job side by side")
    demo.add_argument("--scale", default="cpu")
    demo.add_argument("--batch-size", type=int, default=4)
    demo.add_argument("--max-new-tokens", type=int, default=96)
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
    bench.set_defaults(func=cmd_bench)
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
