"""How close plain decoding comes to the memory-bandwidth limit: at batch 1 a decoding step reads every parameter
once, so (parameter bytes per token / seconds per token) / the GPU's peak bandwidth is the share of the limit it
reaches (1.0: purely bandwidth-bound, no overhead)."""

from __future__ import annotations

import os

import torch

# Peak HBM bandwidth (TB/s) by GPU name, from the vendors' data sheets; matched by substring, most specific first.
PEAK_BANDWIDTH_TBPS: dict[str, float] = {
    "H100 PCIe": 2.0,
    "H100 NVL": 3.9,
    "H100": 3.35,  # SXM5 (the name of the SXM part has no form factor in it: "NVIDIA H100 80GB HBM3")
    "H200": 4.8,
    "A100 80GB": 2.0,
    "A100-SXM4-80GB": 2.0,
}
BANDWIDTH_ENV = "SPECMM_PEAK_BANDWIDTH_TBPS"  # the peak of a GPU the table lacks, in TB/s


def peak_bandwidth(gpu_name: str | None) -> float | None:
    """Peak memory bandwidth in TB/s of `gpu_name` (the table, else $SPECMM_PEAK_BANDWIDTH_TBPS), None if unknown."""
    if gpu_name:
        for key, value in PEAK_BANDWIDTH_TBPS.items():
            if key.lower() in gpu_name.lower():
                return value
    text = os.environ.get(BANDWIDTH_ENV)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{BANDWIDTH_ENV}: expected a number of TB/s, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{BANDWIDTH_ENV}: expected a positive number of TB/s, got {text!r}")
    return value


def bandwidth_fraction(parameters: int, bytes_per_parameter: int, tokens_per_s: float,
                       peak_tbps: float | None) -> float | None:
    """Share of the bandwidth limit plain batch-1 decoding reaches (None when the peak is unknown)."""
    if peak_tbps is None or tokens_per_s <= 0:
        return None
    return parameters * bytes_per_parameter * tokens_per_s / (peak_tbps * 1e12)


def gpu_info(device: torch.device | str) -> dict:
    """Name, memory and peak bandwidth of a CUDA device ({} on other devices)."""
    device = torch.device(device)
    if device.type != "cuda":
        return {}
    props = torch.cuda.get_device_properties(device)
    peak = peak_bandwidth(props.name)
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "peak_bandwidth_tbps": peak if peak is not None else "unknown"}


__all__ = ["BANDWIDTH_ENV", "PEAK_BANDWIDTH_TBPS", "bandwidth_fraction", "gpu_info", "peak_bandwidth"]
