"""`specmm bench suite`: every modality's benchmark as one command cut into self-contained steps, each of which
builds its zoo entries, runs its bench and writes its reports at once, so a GPU lent in short stretches can run
it step by step (`--only`, `--resume`)."""

from specmm.bench.suite.bandwidth import PEAK_BANDWIDTH_TBPS, bandwidth_fraction, gpu_info, peak_bandwidth
from specmm.bench.suite.run import BenchRunner, SuiteConfig, run_suite, step_done
from specmm.bench.suite.steps import STEPS, Step, select_steps
from specmm.bench.suite.summary import ANCHORS, summary_markdown, write_summary

__all__ = ["ANCHORS", "PEAK_BANDWIDTH_TBPS", "BenchRunner", "STEPS", "Step", "SuiteConfig", "bandwidth_fraction",
           "gpu_info",
           "peak_bandwidth", "run_suite", "select_steps", "step_done", "summary_markdown", "write_summary"]
