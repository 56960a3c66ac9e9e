"""The `specmm` command: `demo`, `zoo list|build|path`, `bench core|vlm|ssm|image_ar|cspd|dlm|reasoning|suite`,
`caption`, `train-drafter`, `distill-draft`, `sample-images`, `train-image-drafter`, `sample-continuous`, `reason`.

The CLI sits on top of the library: one submodule per command group (`zoo`, `bench`, `vlm`, `images`,
`image_drafter`, `continuous`, `reason`) registers its subcommands, and modality packages never import it.

One error path: an expected failure (bad input, a file that cannot be read or loaded, an output another job
holds, NaN in a model) prints `specmm: error: <what, which argument or file, what to do>` and exits with 2;
`-v` (before or after the subcommand) also prints the traceback. A message that starts with a library argument's
name (`max_new_tokens: ...`) is shown with the option that sets it (`--max-new-tokens: ...`). Argument errors are
argparse usage errors (exit 2 as well). Ctrl-C prints one line (what a job finished stays in its output, for
--resume) and exits with 130, as shells expect of an interrupted command; so does Ctrl-C while the command is still
importing (the console script's entry point, `specmm_launcher`, catches it there).

`--help` of every subcommand shows each option's default and choices.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import re
import sys
import traceback

import specmm
from specmm.cli import bench, continuous, demo, distill, image_drafter, images, reason, suite, vlm, zoo
from specmm.cli.common import SCALE_HELP, SHARED_HELP, ZOO_SCALES


def _add_verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept `-v` after any subcommand too (SUPPRESS: a subcommand without it keeps the top-level value)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if not any("-v" in a.option_strings for a in sub._actions):
                    sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                     help="log progress and show tracebacks of errors")
                _add_verbose_everywhere(sub)


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subparsers(sub)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help with each option's default, except where there is none to show (a flag's False, an unset None)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = not (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                     or action.required)
        if shown and "%(default)" not in text and (action.option_strings or action.nargs in ("?", "*")):
            text += " (default: %(default)s)"
        return text


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's --help shows defaults: options without help take the shared text of their dest, and a
    dtype default is shown by its name."""
    for sub in _subparsers(parser):
        sub.formatter_class = DefaultsFormatter
        for action in sub._actions:
            if action.dest == "scale" and action.choices is None:  # a bench's own parser (below the CLI)
                action.choices = ZOO_SCALES
                action.help = f"{action.help}; {SCALE_HELP}" if action.help else SCALE_HELP
            if action.help is None:
                action.help = SHARED_HELP.get(action.dest)
            if type(action.default).__name__ == "dtype":  # torch.dtype: parsed from its name (argparse types str)
                action.default = str(action.default).removeprefix("torch.")


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
    _show_defaults(parser)
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


def option_names(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, str]:
    """dest -> how the user spells it (`--max-new-tokens`, or a positional's metavar) in the subcommand `argv` ran."""
    names: dict[str, str] = {}
    current = parser
    words = [w for w in argv if not w.startswith("-")]
    while True:
        for action in current._actions:
            if not isinstance(action, argparse._SubParsersAction):
                longs = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
                names[action.dest] = longs[0] if longs else (action.metavar or action.dest).upper()  # deepest wins
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        word = next((w for w in words if sub is not None and w in sub.choices), None)
        if word is None:
            return names
        words = words[words.index(word) + 1:]
        current = sub.choices[word]


def user_facing(message: str, names: dict[str, str]) -> str:
    """`max_new_tokens: ...` -> `--max-new-tokens: ...` when the subcommand has that option."""
    found = re.match(r"([A-Za-z_]\w*): ", message)
    if found and found.group(1) in names:
        return names[found.group(1)] + message[found.end(1):]
    return message


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except expected_errors() as err:
        if verbose:
            traceback.print_exc()
        print(f"specmm: error: {user_facing(describe(err), option_names(parser, argv))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        print("specmm: interrupted; what was finished is kept (a job or bench with --resume goes on from there)",
              file=sys.stderr)
        return 130


__all__ = ["build_parser", "describe", "expected_errors", "main", "option_names", "user_facing"]
