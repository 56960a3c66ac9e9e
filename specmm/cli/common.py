"""Argument types and defaults every `specmm` subcommand shares (dtype names, positive integers, draft shapes)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

import specmm


def dtype_arg(name: str) -> torch.dtype:
    """`--dtype` value: float32 | float16 | bfloat16."""
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(table)}")
    return table[name]


def positive_int(text: str) -> int:
    """An integer argument >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def command_line() -> str:
    """The command as typed, for reports (`specmm bench ...`)."""
    return "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# Draft shapes that pay on each device: on CPU a draft forward costs ~0.2 target forwards (framework overhead
# of tiny models), so drafts stay short; on a GPU verification of 24 nodes costs about one decode step.
DRAFT_DEFAULTS = {"cpu": dict(k=2, depth=3, top_k=2, total_tokens=8),
                  "cuda": dict(k=4, depth=5, top_k=4, total_tokens=24)}


def fill_draft_defaults(args) -> None:
    """Set --k, --depth, --top-k and --total-tokens left unset to the defaults of --device."""
    defaults = DRAFT_DEFAULTS.get(torch.device(args.device).type, DRAFT_DEFAULTS["cuda"])
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def dynamic_tree(args) -> specmm.TreeSpec:
    return specmm.TreeSpec.dynamic(depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens)


def mkdir(path: str) -> Path:
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


__all__ = ["DRAFT_DEFAULTS", "command_line", "default_device", "dtype_arg", "dynamic_tree", "fill_draft_defaults",
           "mkdir", "positive_int"]
