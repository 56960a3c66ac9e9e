"""The suite's added figures: peak bandwidth by GPU name, the bandwidth-limit share, and the summary's anchors."""

from __future__ import annotations

import pytest

from specmm.bench.suite import bandwidth_fraction, peak_bandwidth, summary_markdown
from specmm.bench.suite.bandwidth import BANDWIDTH_ENV


@pytest.mark.parametrize("name, tbps", [("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0),
                                        ("NVIDIA H200", 4.8), ("NVIDIA A100-SXM4-80GB", 2.0),
                                        ("NVIDIA A100 80GB PCIe", 2.0)])
def test_peak_bandwidth_by_gpu_name(name, tbps, monkeypatch):
    monkeypatch.delenv(BANDWIDTH_ENV, raising=False)
    assert peak_bandwidth(name) == tbps


def test_unknown_gpu_takes_the_environment_or_stays_unknown(monkeypatch):
    monkeypatch.delenv(BANDWIDTH_ENV, raising=False)
    assert peak_bandwidth("NVIDIA L4") is None
    monkeypatch.setenv(BANDWIDTH_ENV, "0.3")
    assert peak_bandwidth("NVIDIA L4") == 0.3
    monkeypatch.setenv(BANDWIDTH_ENV, "fast")
    with pytest.raises(ValueError, match=BANDWIDTH_ENV):
        peak_bandwidth("NVIDIA L4")


def test_bandwidth_fraction_is_bytes_read_per_second_over_the_peak():
    # 1e9 bf16 parameters at 1000 tokens/s read 2 TB/s: 0.6 of an H100 SXM's 3.35 TB/s
    assert bandwidth_fraction(10**9, 2, 1000.0, 3.35) == pytest.approx(2.0 / 3.35)
    assert bandwidth_fraction(10**9, 2, 1000.0, None) is None


def test_summary_puts_each_speculative_row_beside_its_papers_figure():
    record = {"step": "vlm", "device": "cuda", "figures_meaningful": True, "gpu": {"gpu": "NVIDIA H100 80GB HBM3"},
              "mode": {"dtype": "bfloat16", "mode": "compiled"}, "timing": {"total_s": 300.0, "budget_s": 540.0},
              "rows": [{"report": "T=0, batch 1", "method": "target-only", "plain": True},
                       {"report": "T=0, batch 1", "method": "specmm vispec, dynamic", "plain": False,
                        "speedup_vs_best_ar": 2.6, "mean_accepted": 3.25, "overhead_efficiency": 0.8}]}
    text = summary_markdown([record])
    assert "| vlm | T=0, batch 1 | specmm vispec, dynamic | 2.60x | 3.25 | 0.80 | ViSpec 3.22x |" in text
    assert "target-only |" not in text.split("## Steps")[0] and "TINY" not in text
