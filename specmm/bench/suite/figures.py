"""A step's own report: the rows of its bench reports with absolute tokens/s, speedup over the best AR baseline,
mean accepted and overhead efficiency, the GPU, each target's share of the memory-bandwidth limit, and where the
time went (zoo builds against the bench)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from specmm.bench.report import TINY_WARNING
from specmm.bench.suite.bandwidth import bandwidth_fraction, gpu_info
from specmm.bench.suite.steps import TINY, Step
from specmm.machine import machine_info


def bench_reports(folder: Path, files: list[str]) -> list[tuple[str, dict]]:
    """(file stem, report) of every benchmark report among `files` (a JSON holding one, a list, or {"reports"})."""
    found = []
    for name in files:
        if not name.endswith(".json"):
            continue
        data = json.loads((folder / name).read_text())
        reports = data.get("reports", [data]) if isinstance(data, dict) else data
        found += [(name[:-5], r) for r in reports if isinstance(r, dict) and "rows" in r]
    return found


def _plain(report: dict) -> list[dict]:
    """The report's plain-decoding rows: its baselines, else its first row (the reference it compares with)."""
    rows = [r for r in report["rows"] if r.get("error") is None]
    baselines = [r for r in rows if r.get("baseline")]
    return baselines or rows[:1]


def method_rows(reports: list[tuple[str, dict]]) -> list[dict]:
    """One line per bench row: the report, method, tokens/s, speedup over the best plain row, mean accepted,
    overhead efficiency (speedup over best AR / mean accepted) and whether it ran compiled."""
    lines = []
    for stem, report in reports:
        plain = _plain(report)
        best = max((r["tokens_per_s"] for r in plain), default=0.0)
        for row in report["rows"]:
            if row.get("error") is not None:
                lines.append({"report": report["name"], "method": row["method"], "error": row["error"]})
                continue
            vs_ar = row.get("speedup_vs_best_ar")
            if vs_ar is None and best > 0 and plain:  # benches without baseline rows: over their first row
                vs_ar = row["speedup"] / max(r["speedup"] for r in plain)
            accepted = 1.0 if row in plain else row.get("mean_accepted")
            efficiency = vs_ar / accepted if vs_ar is not None and accepted else None
            lines.append({"report": report["name"], "stem": stem, "method": row["method"],
                          "tokens_per_s": row["tokens_per_s"], "speedup_vs_best_ar": vs_ar,
                          "mean_accepted": accepted, "overhead_efficiency": efficiency,
                          "plain": row in plain, "compiled": bool(row.get("compiled"))})
    return lines


def bandwidth_rows(step: Step, scale: str, reports: list[tuple[str, dict]], peak_tbps, bytes_per_parameter: int
                   ) -> list[dict]:
    """Per target: its fastest plain batch-1 decoding and the share of the bandwidth limit that reaches."""
    lines = []
    for target in step.targets(scale):
        speeds = [row["tokens_per_s"] for stem, report in reports if target.report in stem
                  for row in _plain(report) if step.batch_one(report, row)]
        tokens_per_s = max(speeds, default=None)
        fraction = (bandwidth_fraction(target.parameters, bytes_per_parameter, tokens_per_s, peak_tbps)
                    if tokens_per_s else None)
        why = ("" if fraction is not None else "no batch-1 plain decoding row" if tokens_per_s is None
               else "peak bandwidth unknown (not a GPU, or set SPECMM_PEAK_BANDWIDTH_TBPS)")
        lines.append({"target": target.label, "parameters": target.parameters, "plain_tokens_per_s": tokens_per_s,
                      "bandwidth_fraction": fraction, "why_none": why})
    return lines


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown(record: dict) -> str:
    lines = [f"# specmm bench suite: step `{record['step']}` ({record['scale']}, {record['device']})", ""]
    if record["scale"] == TINY:
        lines += [f"**{TINY_WARNING}**", ""]
    gpu = record["gpu"]
    lines += [f"Command: `{record['command']}`  ", f"Run: {record['created']}  ",
              f"GPU: {gpu.get('gpu', 'none')}" + (f", {gpu['gpu_memory_gib']} GiB, peak bandwidth "
                                                   f"{gpu['peak_bandwidth_tbps']} TB/s" if gpu else "") + "  ",
              f"Precision: {record['mode']['dtype']}; mode: {record['mode']['mode']}", ""]
    t = record["timing"]
    lines += [f"Time: {t['total_s']:.0f} s = zoo builds {t['build_s']:.0f} s + bench {t['bench_s']:.0f} s; budget "
              f"{t['budget_s']:.0f} s ({'within' if t['total_s'] <= t['budget_s'] else 'OVER'}). Builds in this "
              f"step: {', '.join(f'{k} {v:.0f} s' for k, v in record['builds'].items())} (0 s: already built).", ""]
    lines += ["| report | method | tokens/s | speedup vs best AR | mean accepted | overhead eff. | compiled |",
              "|---|---|---:|---:|---:|---:|:---:|"]
    for r in record["rows"]:
        if "error" in r:
            lines.append(f"| {r['report']} | {r['method']} | FAILED: {r['error'].replace('|', '/')} | | | | |")
            continue
        lines.append(f"| {r['report']} | {r['method']} | {r['tokens_per_s']:.1f} | "
                     f"{_f(r['speedup_vs_best_ar'], '.2f', 'x')}"
                     f" | {_f(r['mean_accepted'])} | {_f(r['overhead_efficiency'])} | "
                     f"{'yes' if r['compiled'] else 'no'} |")
    lines += ["", "overhead eff. = speedup vs best AR / mean accepted tokens per target forward (1.00: a "
              "speculative round costs one plain decoding step). Benches without a baseline row compare with "
              "their first row.", "", "## Memory-bandwidth limit of plain decoding (batch 1)", "",
              "| target | parameters | plain tokens/s | share of the bandwidth limit |", "|---|---:|---:|---:|"]
    for b in record["bandwidth"]:
        share = _f(b["bandwidth_fraction"], ".1%") if b["bandwidth_fraction"] is not None else f"n/a ({b['why_none']})"
        lines.append(f"| {b['target']} | {b['parameters']:,} | {_f(b['plain_tokens_per_s'], '.1f')} | {share} |")
    lines += ["", f"share = parameters x {record['bytes_per_parameter']} bytes x tokens/s / peak bandwidth: 1.0 "
              "would read every weight once per token at the GPU's peak.", "", "## Zoo entries", ""]
    for name, info in record["zoo"].items():
        lines.append(f"- {name}: {json.dumps(info)}")
    lines += ["", "## Reports", ""] + [f"- [{name}]({name})" for name in record["bench_files"]]
    return "\n".join(lines) + "\n"


def _zoo_summary(step: Step, scale: str) -> dict:
    """Build time, parameters and held-out quality of each zoo entry, as its zoo.json records them."""
    from specmm import zoo

    keep = ("wall_time_s", "parameters", "models", "heldout", "heldout_loss", "greedy_agreement", "target", "draft",
            "model", "gpt", "drafter", "classifier")
    summary = {}
    for name in step.zoo:
        record = zoo.record(name, scale)
        summary[name] = {k: _drop_files(record[k]) for k in keep if k in record}
    return summary


def _drop_files(value):
    if isinstance(value, dict):
        return {k: _drop_files(v) for k, v in value.items() if k not in ("files", "recipe")}
    return value


def step_report(step: Step, config, files: list[str], *, argv: list[str], mode: dict, builds: dict,
                timing: dict) -> dict:
    """The step's record (JSON-serialisable) with its Markdown under "markdown"."""
    device = torch.device(config.device)
    reports = bench_reports(config.out, files)
    gpu = gpu_info(device)
    peak = gpu.get("peak_bandwidth_tbps")
    bytes_per_parameter = 2 if config.dtype in ("bfloat16", "float16") else 4
    record = {"step": step.name, "scale": config.scale, "device": str(device),
              "figures_meaningful": config.scale != TINY, "command": "specmm " + " ".join(argv),
              "created": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": gpu, "machine": machine_info(device), "mode": mode,
              "timing": {**timing, "total_s": round(timing["build_s"] + timing["bench_s"], 1)}, "builds": builds,
              "bytes_per_parameter": bytes_per_parameter, "rows": method_rows(reports),
              "bandwidth": bandwidth_rows(step, config.scale, reports, peak if isinstance(peak, float) else None,
                                          bytes_per_parameter),
              "zoo": _zoo_summary(step, config.scale), "bench_files": files}
    record["markdown"] = markdown(record)
    return record


__all__ = ["TINY_WARNING", "bandwidth_rows", "bench_reports", "method_rows", "step_report"]
