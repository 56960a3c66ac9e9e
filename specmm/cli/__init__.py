"""The `specmm` command: `demo`, `zoo list|build|path`, `bench core|vlm|ssm|image_ar|cspd|dlm|reasoning|suite`, `caption`,
`train-drafter`, `distill-draft`, `sample-images`, `train-image-drafter`, `sample-continuous`, `reason`.

The CLI sits on top of the library: one submodule per command group (`zoo`, `bench`, `vlm`, `images`,
`image_drafter`, `continuous`, `reason`) registers its subcommands, and modality packages never import it.

One error path: an expected failure (bad input, a file that cannot be read or loaded, an output another job
holds, NaN in a model) prints `specmm: error: <what, which argument or file, what to do>` and exits with 2;
`-v` (before or after the subcommand) also prints the traceback. Argument errors are argparse usage errors
(exit 2 as well). Ctrl-C prints one line (what a job finished stays in its output, for --resume) and exits with
130, as shells expect of an interrupted command.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import sys
import traceback

import specmm
from specmm.cli import bench, continuous, demo, distill, image_drafter, images, reason, suite, vlm, zoo


def _add_verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept `-v` after any subcommand too (SUPPRESS: a subcommand without it keeps the top-level value)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if not any("-v" in a.option_strings for a in sub._actions):
                    sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                     help="log progress and show tracebacks of errors")
                _add_verbose_everywhere(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specmm", description=specmm.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    zoo.add_parser(sub)
    bench_sub = bench.add_parser(sub)
    vlm.add_parsers(sub)  # train-drafter, caption
    distill.add_parser(sub)  # distill-draft
    images.add_parser(sub)  # sample-images
    image_drafter.add_parser(sub)  # train-image-drafter
    continuous.add_parser(sub)  # sample-continuous
    reason.add_parsers(sub, bench_sub)  # `reason`, `bench reasoning`
    suite.add_parser(bench_sub)  # `bench suite`
    _add_verbose_everywhere(parser)
    return parser


def expected_errors() -> tuple[type[BaseException], ...]:
    """Failures a user can fix (reported in one line); anything else is a bug and keeps its traceback."""
    errors: list[type[BaseException]] = [ValueError, OSError, pickle.UnpicklingError]
    try:
        from safetensors import SafetensorError
        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors is a dependency
        pass
    return tuple(errors)


def describe(err: BaseException) -> str:
    """One line for an expected error: its message, or for a bare OSError its reason and file."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except expected_errors() as err:
        if verbose:
            traceback.print_exc()
        print(f"specmm: error: {describe(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        print("specmm: interrupted; what was finished is kept (a job or bench with --resume goes on from there)",
              file=sys.stderr)
        return 130


__all__ = ["build_parser", "describe", "expected_errors", "main"]
