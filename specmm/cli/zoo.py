"""`specmm zoo list|build|path`: the reference models specmm trains itself.

`build --seed N` builds (or finds) the seed-N build in its own folder; `path` checks a build's integrity (every
file's size and sha256 against its zoo.json) as `build` does before it answers.
"""

from __future__ import annotations

import json

from specmm.cli.common import nonnegative_int


def cmd_zoo(args) -> int:
    from specmm import zoo

    if args.zoo_command == "list":
        for entry in zoo.REGISTRY.values():
            built = [scale for scale in entry.recipes if zoo.is_built(entry.name, scale)]
            print(f"{entry.name:<19} scales: {', '.join(entry.recipes):<16} built: {', '.join(built) or '-':<10} "
                  f"{entry.description}")
    elif args.zoo_command == "build":
        path = zoo.build(args.name, args.scale, seed=args.seed, force=args.force)
        record = zoo.record(args.name, args.scale, seed=args.seed)
        print(json.dumps({k: v for k, v in record.items() if k not in ("files", "recipe")}, indent=2))
        print(path)
    else:
        print(zoo.path(args.name, args.scale, seed=args.seed, verify=True))
    return 0


def add_parser(sub) -> None:
    zoo = sub.add_parser("zoo", help="reference models specmm trains itself")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zsub.add_parser("list")
    for name in ("build", "path"):
        p = zsub.add_parser(name)
        p.add_argument("name")
        p.add_argument("--scale", default="cpu")
        p.add_argument("--seed", type=nonnegative_int, default=0, help="each seed is its own build (default 0)")
        if name == "build":
            p.add_argument("--force", action="store_true", help="discard any existing build and start over")
    zoo.set_defaults(func=cmd_zoo)


__all__ = ["add_parser", "cmd_zoo"]
