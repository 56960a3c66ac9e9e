"""The steps of `specmm bench suite`: per modality, the zoo entries it builds, the bench command it runs at each
scale, and which of that bench's rows are each target's plain batch-1 decoding (for the bandwidth figure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TINY = "tiny"  # the CI scale: machinery only, figures meaningless


@dataclass(frozen=True)
class Target:
    label: str  # as the report names it
    parameters: int
    report: str  # a substring of the stem of the bench report file that times it


@dataclass(frozen=True)
class Step:
    name: str
    command: tuple[str, ...]  # the bench subcommand, e.g. ("bench", "core")
    zoo: tuple[str, ...]  # entries built before the bench (dependencies first), timed apart
    tiny_args: tuple[str, ...]  # bench options at the tiny scale: seconds on a CPU
    full_args: tuple[str, ...]  # bench options at every other scale (sized for <= 9 minutes with the build)
    targets: Callable[[str], list[Target]]  # scale -> the targets whose plain decoding the bench times
    batch_one: Callable[[dict, dict], bool]  # (report, row) -> the row decoded at batch 1
    compile_flags: tuple[str, ...] = ("--compile",)  # the first one the bench's parser has turns compiled mode on

    def args(self, scale: str) -> list[str]:
        return list(self.tiny_args if scale == TINY else self.full_args)


def _params(entry: str, scale: str, *keys: str) -> int:
    from specmm import zoo

    record = zoo.record(entry, scale)
    for key in keys:
        record = record[key]
    return int(record)


def _always(report: dict, row: dict) -> bool:  # the suite runs the bench at batch 1 only
    return True


def _setup_batch(key: str) -> Callable[[dict, dict], bool]:
    return lambda report, row: report.get("setup", {}).get(key) == 1


def _method_batch(report: dict, row: dict) -> bool:
    return row["method"].endswith("(bs 1)")


def _never(report: dict, row: dict) -> bool:  # the bench decodes in batches only
    return False


STEPS: dict[str, Step] = {step.name: step for step in (
    Step("core", ("bench", "core"), ("code",),
         tiny_args=("--batch-size", "1", "--max-new-tokens", "4", "--repeats", "1", "--warmup", "1"),
         full_args=("--batch-size", "1", "--max-new-tokens", "128", "--repeats", "3", "--warmup", "2"),
         targets=lambda s: [Target("code target", _params("code", s, "models", "target", "parameters"), "core")],
         batch_one=_always),
    Step("vlm", ("bench", "vlm"), ("captioner", "captioner-drafters"),
         tiny_args=("--scenes", "1", "--batch-sizes", "1", "--temperatures", "0", "--max-new-tokens", "4",
                    "--methods", "vispec", "--trees", "chain", "--repeats", "1", "--warmup", "1"),
         full_args=("--scenes", "8", "--batch-sizes", "1", "8", "--temperatures", "0", "--max-new-tokens", "160",
                    "--trees", "dynamic", "--repeats", "2", "--warmup", "2"),
         targets=lambda s: [Target("captioner target", _params("captioner", s, "models", "target", "parameters"),
                                   "vlm")],
         batch_one=_setup_batch("batch")),
    Step("image_ar", ("bench", "image_ar"), ("imagegen",),
         tiny_args=("--images", "2", "--batch-sizes", "1", "--methods", "ar,lantern,gsd"),
         full_args=("--images", "40", "--batch-sizes", "1", "8"),
         targets=lambda s: [Target("imagegen GPT", _params("imagegen", s, "gpt", "parameters"), "image_ar")],
         batch_one=_method_batch),
    Step("cspd", ("bench", "cspd"), ("cspd",),
         tiny_args=("--images", "2", "--batch-size", "2", "--k", "2", "--rules", "trajectory"),
         full_args=("--images", "200", "--batch-size", "50", "--k", "4", "--repeats", "1", "--warmup", "1"),
         targets=lambda s: [Target("cspd target", _params("cspd", s, "target", "parameters"), "cspd")],
         batch_one=_never, compile_flags=("--compile", "--compile-heads")),
    Step("ssm", ("bench", "ssm"), ("code", "ssm-code"),
         # the code draft only: distilling a draft per target (--drafts distilled) does not fit the step's budget
         tiny_args=("--batch-size", "1", "--max-new-tokens", "4", "--repeats", "1", "--drafts", "code"),
         full_args=("--batch-size", "1", "--max-new-tokens", "128", "--repeats", "3", "--drafts", "code"),
         targets=lambda s: [Target(f"ssm-code {role}", _params("ssm-code", s, "models", role, "parameters"),
                                   f"-{role}") for role in ("mamba2", "hybrid")],
         batch_one=_always),
    Step("dlm", ("bench", "dlm"), ("code", "dlm-code"),
         tiny_args=("--prompts", "1", "--batch-size", "1", "--gen-length", "8", "--block-length", "4",
                    "--draft-size", "2", "--tree-width", "2", "--caches", "none", "--repeats", "1", "--warmup", "0"),
         full_args=("--prompts", "8", "--batch-size", "1", "--gen-length", "64", "--block-length", "16",
                    "--draft-size", "8", "--repeats", "2", "--warmup", "1"),
         targets=lambda s: [Target("dlm-code model", _params("dlm-code", s, "model", "parameters"), "dlm")],
         batch_one=_always),
    Step("reasoning", ("bench", "reasoning"), ("chainarith",),
         tiny_args=("--batch-sizes", "1", "--problems", "1", "--specreason-thresholds", "6",
                    "--arbitrage-thresholds", "0.5", "--max-new-tokens", "12", "--max-step-tokens", "4"),
         full_args=("--batch-sizes", "1", "64", "--problems", "64", "128"),
         targets=lambda s: [Target("chainarith target", _params("chainarith", s, "models", "target", "parameters"),
                                   "reasoning")],
         batch_one=_setup_batch("batch")),
)}


def select_steps(only: str | None) -> list[Step]:
    """The steps `--only` names (comma-separated, run in the suite's order), all of them when None; an unknown or
    empty name is a ValueError before any work."""
    if only is None:
        return list(STEPS.values())
    names = [n.strip() for n in only.split(",")]
    if not all(names):
        raise ValueError(f"--only: expected comma-separated step names from {', '.join(STEPS)}, got {only!r}")
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise ValueError(f"--only: unknown step(s) {', '.join(map(repr, unknown))}; steps: {', '.join(STEPS)}")
    return [step for name, step in STEPS.items() if name in names]


__all__ = ["STEPS", "Step", "TINY", "Target", "select_steps"]
