"""The suite's summary: one table of every step's speculative rows (speedup over the best AR baseline, mean
accepted, overhead efficiency) beside the figure the method's paper reports, written as `<out>/README.md`."""

from __future__ import annotations

import json
from pathlib import Path

from specmm.jobs import atomic_write_text

# (step, method substring, the paper's headline figure): first match wins. The papers measured 7B-class targets
# on GPUs; the suite's targets are far smaller, so these are bearings, not pass marks.
ANCHORS: list[tuple[str, str, str]] = [
    ("vlm", "vispec", "ViSpec 3.22x"),
    ("core", "tree", "EAGLE-2 ~3x"),
    ("image_ar", "lantern++", "LANTERN++ 2.56x"),
    ("image_ar", "gsd", "GSD 3.7x"),
    ("dlm", "ssd", "SSD 3.46x"),
    ("ssm", "stree", "STree (8B hybrid)"),
]

GOALS = {"core": "dynamic tree >= 2.5x over best AR; overhead eff. >= 0.7",
         "vlm": "vispec >= 2.5x over target-only; batch 8 >= 1.5x",
         "image_ar": "GSD and LANTERN >= 2.0x at a KID within the floor",
         "cspd": "-",
         "ssm": "STree >= 1.6x over AR and >= 1.2x over chain SD",
         "dlm": "SSD >= 3x fewer forwards and >= 2x wall-clock over stepwise",
         "reasoning": "Arbitrage >= 2x at equal accuracy; batch 64 no slower than target-only"}


def anchor(step: str, method: str) -> str:
    name = method.lower()
    return next((text for s, key, text in ANCHORS if s == step and key in name), "-")


def _f(value, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{suffix}"


def step_records(out: Path) -> list[dict]:
    """The step reports under `out`, in the suite's step order."""
    from specmm.bench.suite.steps import STEPS

    records = []
    for name in STEPS:
        try:
            records.append(json.loads((out / f"{name}.json").read_text()))
        except (OSError, ValueError):
            continue
    return records


def summary_markdown(records: list[dict], tiny: bool = False) -> str:
    """The summary table of `records` (step reports), one line per speculative row."""
    from specmm.bench.suite.figures import TINY_WARNING

    lines = ["# specmm bench suite: summary", ""]
    if tiny or any(not r.get("figures_meaningful", True) for r in records):
        lines += [f"**{TINY_WARNING}**", ""]
    if not records:
        return "\n".join(lines + ["No step has finished yet.", ""])
    gpus = sorted({r["gpu"].get("gpu", "no GPU") for r in records})
    lines += [f"Device: {', '.join(gpus)}. Per-step details, the bandwidth figures and every bench report are in "
              "the steps' own reports linked below.", "",
              "| step | report | method | speedup vs best AR | mean accepted | overhead eff. | paper's figure |",
              "|---|---|---|---:|---:|---:|---|"]
    for record in records:
        for row in record["rows"]:
            if row.get("plain"):
                continue
            if "error" in row:
                lines.append(f"| {record['step']} | {row['report']} | {row['method']} | FAILED | | | |")
                continue
            lines.append(f"| {record['step']} | {row['report']} | {row['method']} | "
                         f"{_f(row['speedup_vs_best_ar'], 'x')} | {_f(row['mean_accepted'])} | "
                         f"{_f(row['overhead_efficiency'])} | {anchor(record['step'], row['method'])} |")
    lines += ["", "## Steps", "", "| step | device | precision / mode | time (budget) | goal | report |",
              "|---|---|---|---:|---|---|"]
    for record in records:
        t = record["timing"]
        lines.append(f"| {record['step']} | {record['gpu'].get('gpu', record['device'])} | {record['mode']['dtype']}, "
                     f"{record['mode']['mode']} | {t['total_s']:.0f} s ({t['budget_s']:.0f} s) | "
                     f"{GOALS.get(record['step'], '-')} | [{record['step']}.md]({record['step']}.md) |")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, tiny: bool = False) -> Path:
    """(Re)write `<out>/README.md` from the step reports there."""
    path = Path(out) / "README.md"
    atomic_write_text(path, summary_markdown(step_records(Path(out)), tiny))
    return path


__all__ = ["ANCHORS", "GOALS", "anchor", "step_records", "summary_markdown", "write_summary"]
