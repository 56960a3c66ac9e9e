"""`specmm zoo list|build|path`: the reference models specmm trains itself.

`build --seed N` builds (or finds) the seed-N build in its own folder; `path` checks a build's integrity (every
file's size and sha256 against its zoo.json) as `build` does before it answers.
"""

from __future__ import annotations

from specmm.cli.common import nonnegative_int, scale_argument


def build_summary(record: dict) -> str:
    """One line for a finished build: what it is, its models' sizes and how long it took (zoo.json has the rest)."""
    models = record.get("models") or {}
    sizes = ", ".join(f"{role} {m['parameters'] / 1e6:.2f}M params" for role, m in models.items()
                      if isinstance(m, dict) and isinstance(m.get("parameters"), (int, float)))
    took = record.get("wall_time_s")
    parts = [f"{record['name']} ({record['scale']}, seed {record.get('seed', 0)})", sizes,
             f"built in {took:.0f} s" if isinstance(took, (int, float)) else ""]
    return "; ".join(p for p in parts if p) + "; details in zoo.json"


def cmd_zoo(args) -> int:
    from specmm import zoo

    if args.zoo_command == "list":
        rows = [(entry.name, ", ".join(entry.recipes),
                 ", ".join(s for s in entry.recipes if zoo.is_built(entry.name, s)) or "-", entry.description)
                for entry in zoo.REGISTRY.values()]
        header = ("entry", "scales", "built", "what it is")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    elif args.zoo_command == "build":
        zoo.check(args.name, args.scale)
        path = zoo.build(args.name, args.scale, seed=args.seed, force=args.force)
        print(build_summary(zoo.record(args.name, args.scale, seed=args.seed)))
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
        scale_argument(p)
        p.add_argument("--seed", type=nonnegative_int, default=0, help="each seed is its own build (default 0)")
        if name == "build":
            p.add_argument("--force", action="store_true", help="discard any existing build and start over")
    zoo.set_defaults(func=cmd_zoo)


__all__ = ["add_parser", "cmd_zoo"]
