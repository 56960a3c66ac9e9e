"""Argument types and helpers every `specmm` subcommand shares: checked counts and numbers (each refusal names
the argument and the allowed range, before any work), devices, local model folders, loading errors that name the
file, text inputs, draft shapes."""

from __future__ import annotations

import argparse
import math
import pickle
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import specmm


def dtype_arg(name: str) -> torch.dtype:
    """`--dtype` value: float32 | float16 | bfloat16."""
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(table)}")
    return table[name]


def _range_text(low, high) -> str:
    if high is None:
        return f">= {low}"
    return f"in [{low}, {high}]"


def int_range(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (no upper bound when `high` is None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {_range_text(low, high)}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {_range_text(low, high)}, got {value}")
        return value
    parse.__name__ = f"integer {_range_text(low, high)}"
    return parse


positive_int = int_range(1)
"""An integer argument >= 1."""
nonnegative_int = int_range(0)
"""An integer argument >= 0."""


def float_range(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                high_open: bool = False):
    """An argparse type: a finite number in the given interval (NaN and +-inf always refused)."""
    left = "" if low is None else (f"> {low}" if low_open else f">= {low}")
    right = "" if high is None else (f"< {high}" if high_open else f"<= {high}")
    bounds = " and ".join(b for b in (left, right) if b)
    wanted = "a finite number" + (f" {bounds}" if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        bad = (not math.isfinite(value) or (low is not None and (value <= low if low_open else value < low))
               or (high is not None and (value >= high if high_open else value > high)))
        if bad:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text}")
        return value
    parse.__name__ = wanted
    return parse


finite_float = float_range()
temperature_arg = float_range(0.0)  # 0 is greedy
probability = float_range(0.0, 1.0, low_open=True)  # top-p


def latent_size_arg(text: str) -> tuple[int, int]:
    """`--latent-size HxW`: an image of H rows of W latent tokens (e.g. 32x32), as (height, width)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected HxW in latent tokens, e.g. 32x32, got {text!r}")
    return int(parts[0]), int(parts[1])


def device_arg(text: str) -> str:
    """`--device`: cpu, cuda, cuda:N or mps, refused here (not as a traceback later) when this machine lacks it."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a torch device such as cpu, cuda or cuda:0, got {text!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is available on this machine "
                                             "(torch.cuda.is_available() is False); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or mps, got {text!r}")
    return text


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hugging Face Hub spells a repository


def model_folder(argument: str, path: str | None, needs: str = "config.json") -> Path | None:
    """The local folder of the model `path` names (the value of `argument`), checked before loading to hold
    `needs`. `path` is a local folder, or a Hugging Face Hub id (`owner/name`, as `from_pretrained` takes), which is
    fetched into the Hub's cache (or found there offline) and answered by its local snapshot."""
    if path is None:
        return None
    folder = Path(path)
    if not folder.exists() and HUB_ID.match(str(path)):
        folder = hub_snapshot(argument, str(path))
    if not folder.exists():
        raise FileNotFoundError(f"{argument}: {path} does not exist (expected a local model folder or a Hugging Face "
                                "Hub id such as owner/name)")
    if not folder.is_dir():
        raise ValueError(f"{argument}: {path} is a file, expected a local model folder with {needs}")
    if needs and not (folder / needs).is_file():
        raise FileNotFoundError(f"{argument}: no {needs} in {path} (expected a saved model folder)")
    return folder


def local_path(folder: Path | None) -> str | None:
    """`model_folder`'s answer as the string an argument holds (None stays None)."""
    return None if folder is None else str(folder)


HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "tokenizer*", "*.safetensors"]


def hub_snapshot(argument: str, repo_id: str) -> Path:
    """A local snapshot of the Hub repository `repo_id`: its configs, tokenizer and processor files and
    safetensors weights (pickled `.bin` weights only where it has no safetensors). Offline (no network, or
    HF_HUB_OFFLINE=1) the Hub cache answers; a repository in neither is refused naming `argument`."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        files = HfApi().list_repo_files(repo_id)
        patterns = HUB_FILES if any(f.endswith(".safetensors") for f in files) else [*HUB_FILES[:-1], "*.bin"]
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as online:  # noqa: BLE001 - offline, unknown or gated: the local cache may still hold it
        try:
            return Path(snapshot_download(repo_id, local_files_only=True))
        except Exception:  # noqa: BLE001
            reason = " ".join(str(online).split())[:300] or type(online).__name__
            raise ValueError(f"{argument}: {repo_id} is not a local folder, and the Hugging Face Hub could not give "
                             f"it ({type(online).__name__}: {reason}); it is not in the local Hub cache either. "
                             f"Fetch it where there is a network (`hf download {repo_id}`) or pass a local folder"
                             ) from None


def input_file(argument: str, path: str) -> Path:
    """Check that `path` (the value of `argument`) is an existing file."""
    file = Path(path)
    if not file.is_file():
        what = "is a folder" if file.is_dir() else "does not exist"
        raise FileNotFoundError(f"{argument}: {path} {what} (expected a file)")
    return file


def _load_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, ValueError, KeyError, RuntimeError, EOFError,
                                         pickle.UnpicklingError]
    try:
        from safetensors import SafetensorError
        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors is a dependency
        pass
    return tuple(errors)


@contextmanager
def loading(argument: str, path, what: str = "model") -> Iterator[None]:
    """Turn a failure while loading `path` (a corrupt safetensors header, a refused pickle, a checkpoint that
    does not fit its config, a missing file, ...) into a ValueError naming the argument and the file."""
    try:
        yield
    except _load_errors() as err:
        if isinstance(err, ValueError) and re.match(r"-{0,2}[A-Za-z_][\w\-/]*: ", str(err)):
            raise  # already names what is wrong (e.g. `image_size: ...`): not a damaged file
        reason = " ".join(str(err).split()) or type(err).__name__
        if len(reason) > 600:
            reason = reason[:600] + " ..."
        raise ValueError(f"{argument}: cannot load the {what} at {path}: {type(err).__name__}: {reason}; check that "
                         "the file is complete (re-download or re-save it) and matches its config") from err


def read_text(argument: str, path: str) -> str:
    """A UTF-8 text file's contents; errors name the argument, the file and the byte offset."""
    file = input_file(argument, path)
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        quoted = shlex.quote(str(path))
        raise ValueError(f"{argument}: {path} is not UTF-8 text (byte {err.start}: {err.reason}); convert it from its "
                         f"encoding, e.g. `iconv -f LATIN1 -t UTF-8 {quoted} > {shlex.quote(str(path) + '.utf8')}`, "
                         "and pass the new file") from None


def read_text_lines(argument: str, path: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file (see `read_text`)."""
    return [line for line in read_text(argument, path).splitlines() if line.strip()]


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


def report_lock(out: str | Path, stem: str):
    """The lock a benchmark holds while it runs and writes `<out>/<stem>.*` (a hidden `.<stem>.lock` file): a second
    run writing the same report is refused, naming the first one's PID."""
    from specmm.jobs import OutputLock

    return OutputLock(Path(out) / f".{stem}.lock", "--out/--name", Path(out) / f"{stem}.*")


def set_types(parser: argparse.ArgumentParser, types: dict) -> None:
    """Give the arguments `types` names (dest -> argparse type) checked types after they were registered (for
    parsers a lower layer builds, which cannot import this module)."""
    for action in parser._actions:
        if action.dest in types:
            action.type = types[action.dest]


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """`--resume` / `--force` of a training job, whose folder --out keeps checkpoints: a rerun of the same job goes
    on from its last checkpoint with or without --resume (which only says so); --force starts over."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="go on from the last checkpoint in --out (a rerun of the same job does so anyway)")
    group.add_argument("--force", action="store_true", help="discard what --out holds and start over")


# help of the options many subcommands share, by dest (an option's own help wins)
SHARED_HELP = {
    "device": "torch device: cpu, cuda, cuda:N or mps",
    "dtype": "weights dtype: float32, float16 or bfloat16",
    "out": "output folder or file",
    "batch_size": "rows per batch",
    "max_new_tokens": "new tokens per row at most",
    "repeats": "timed repeats per row of the report (the minimum is reported)",
    "warmup": "untimed warm-up runs before the timed ones",
    "seed": "random seed",
    "temperature": "sampling temperature (0 is greedy)",
    "top_p": "nucleus sampling mass (1 disables top-p)",
    "top_k": "top-k sampling (0 disables top-k)",
    "lr": "learning rate",
    "steps": "training steps",
    "checkpoint_every": "steps between checkpoints",
    "name": "report file stem",
    "scenes": "zoo scenes to run",
    "method": "method to run",
    "batch_sizes": "batch sizes to run, one table each",
    "temperatures": "sampling temperatures to run (0 is greedy)",
    "targets": "targets to run",
    "cfg_scale": "classifier-free guidance scale (>= 1)",
    "window": "SJD / Jacobi window: image tokens drafted per round",
    "delta": "LANTERN's total-variation budget per token",
    "lam": "LANTERN++ / GSD relaxation strength",
    "lantern_k": "LANTERN's latent neighbourhood size",
    "lantern_pp_k": "LANTERN++'s neighbourhood size",
    "gsd_window": "GSD's grouped window",
    "images": "images to sample",
    "prompts": "prompts to run",
    "gen_length": "tokens generated per prompt",
    "block_length": "tokens per semi-autoregressive block",
    "draft_size": "tokens the drafter proposes per round",
    "tree_width": "candidates per drafted position",
    "specreason_thresholds": "SpecReason acceptance thresholds (judge score 0-9) to sweep",
    "arbitrage_thresholds": "Arbitrage router thresholds to sweep",
    "text_steps": "steps of the text-only stage",
    "multimodal_steps": "steps of the image-caption stage",
    "seq_len": "tokens per training window",
    "per_class": "images per class",
    "policy": "step policy: who writes each reasoning step",
    "max_step_tokens": "tokens per reasoning step at most",
}


# every scale a zoo entry has (a test keeps it equal to the zoo's recipes); an entry without one says so
ZOO_SCALES = ("tiny", "cpu", "gpu", "cpu-long", "cpu-deep")


SCALE_HELP = ("zoo scale: tiny builds in seconds (figures meaningless: a pipeline check), cpu trains for minutes "
              "the first time, gpu is for a GPU, cpu-long/cpu-deep are longer CPU recipes of some entries")


def scale_argument(parser: argparse.ArgumentParser, default: str = "cpu", help: str = "") -> None:
    """`--scale`: which build of the zoo models to use (or build on first use), with its choices and costs."""
    parser.add_argument("--scale", default=default, choices=ZOO_SCALES,
                        help=f"{help}; {SCALE_HELP}" if help else SCALE_HELP)


def mkdir(path: str) -> Path:
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


__all__ = [
    "DRAFT_DEFAULTS", "HUB_ID", "SCALE_HELP", "SHARED_HELP", "ZOO_SCALES", "add_job_options", "command_line",
    "default_device", "device_arg", "dtype_arg", "dynamic_tree", "fill_draft_defaults", "finite_float",
    "float_range", "hub_snapshot", "input_file", "int_range", "loading", "local_path", "mkdir", "model_folder",
    "nonnegative_int", "positive_int", "probability", "read_text_lines", "report_lock", "scale_argument",
    "set_types", "temperature_arg",
]
