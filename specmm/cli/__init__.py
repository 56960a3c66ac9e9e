"""The `specmm` command: `demo`, `zoo list|build|path`, `bench core|vlm|ssm|image_ar|cspd|dlm|reasoning`, `caption`,
`train-drafter`, `sample-images`, `sample-continuous`, `reason`.

The CLI sits on top of the library: one submodule per command group (`zoo`, `bench`, `vlm`, `images`,
`continuous`, `reason`) registers its subcommands, and modality packages never import it.
"""

from __future__ import annotations

import argparse
import logging
import sys

import specmm
from specmm.cli import bench, continuous, demo, images, reason, vlm, zoo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specmm", description=specmm.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    zoo.add_parser(sub)
    bench_sub = bench.add_parser(sub)
    vlm.add_parsers(sub)  # train-drafter, caption
    images.add_parser(sub)  # sample-images
    continuous.add_parser(sub)  # sample-continuous
    reason.add_parsers(sub, bench_sub)  # `reason`, `bench reasoning`
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specmm: error: {err}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
