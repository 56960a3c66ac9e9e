"""Shared fixtures: tiny random-weight HF models of several architectures, built from configs."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# inductor's C++ wrapper (compiled mode's default on a CPU machine) costs seconds of C++ compile per graph: off here
# (read when specmm is first imported, after this file) but in the test that sets `compiled.CPP_WRAPPER` itself
os.environ.setdefault("SPECMM_CPP_WRAPPER", "0")
# compiled mode's graphs are captured by dynamo and run as captured (the "eager" backend): inductor's C++ compile
# costs seconds per graph and AOT autograd doubles a capture's cost, minutes over the suite on 2 cores. The graphs
# are the same static-shape graphs over the same static caches; AOT's functionalisation of their in-place writes is
# checked where it matters: inductor's own kernels (the `inductor` fixture) and the LlamaGen fixtures. CUDA graphs'
# rules played on the CPU (`tests.graph_pool`) read in-place writes off version counters, on this backend too.
# SPECMM_TEST_BACKEND=aot_eager runs every capture-only test functionalised (slower).
CAPTURE_BACKEND = os.environ.get("SPECMM_TEST_BACKEND", "eager")
os.environ.setdefault("SPECMM_COMPILE_BACKEND", CAPTURE_BACKEND)
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in `make test`'s parallel workers (pytest-xdist)
if WORKER:
    torch.set_num_threads(1)  # one worker per core: intra-op threads would only contend

VOCAB = 96
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
               pad_token_id=0)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 12}),  # window shorter than the runs
    "gemma": (GemmaConfig, GemmaForCausalLM, {"head_dim": 8, "tie_word_embeddings": False}),
    "phi3": (Phi3Config, Phi3ForCausalLM, {}),
}
# built by tiny_model, outside the all-architecture tests (whose acceptance checks suit the ones above)
MORE_ARCHITECTURES = {
    # a chunked-attention layer (chunks of 6 positions, crossed by every run), then a NoPE full one with MoE
    "llama4": (Llama4TextConfig, Llama4ForCausalLM, {"head_dim": 8, "attention_chunk_size": 6, "no_rope_layers": [1, 0],
                                                     "intermediate_size_mlp": 64, "num_local_experts": 2,
                                                     "interleave_moe_layer_step": 2}),
}


@pytest.fixture
def capture_only(monkeypatch):
    """Compiled mode on the suite's capture backend (`CAPTURE_BACKEND`), whatever an earlier test set."""
    monkeypatch.setattr("specmm.core.compiled.BACKEND", CAPTURE_BACKEND)


@pytest.fixture
def inductor(monkeypatch):
    """Compiled mode on inductor's kernels (the suite's default is graph capture only: `CAPTURE_BACKEND`)."""
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "inductor")


def tiny_model(arch: str = "llama", seed: int = 0, dtype=torch.float64, vocab: int = VOCAB, logit_scale: float = 1.0,
               **overrides):
    """A tiny random-weight model of `arch`; `logit_scale` sharpens its distributions."""
    config_cls, model_cls, extra = {**ARCHITECTURES, **MORE_ARCHITECTURES}[arch]
    config = config_cls(**{**_COMMON, **extra, "vocab_size": vocab, **overrides})
    config._attn_implementation = overrides.pop("attn_implementation", "sdpa")
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def perturbed_copy(model, scale: float, seed: int = 123):
    """A copy of `model` with Gaussian noise (relative to each tensor's std) on every weight."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            p.add_(noise * scale * (p.std() if p.numel() > 1 else 1.0))
    return other


def left_padded_batch(lengths, vocab: int = VOCAB, seed: int = 0):
    """Random prompts of the given lengths, left-padded with 0 -> (input_ids [B, L], attention_mask [B, L])."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, vocab, (n,), generator=gen)
        mask[row, width - n:] = 1
    return ids, mask


@contextmanager
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a 2-core machine shared with other jobs the threads
    spin-wait on each other (up to ~1000x slower on tiny convolutions); the previous setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def llama():
    return tiny_model("llama")


# ------------------------------------------------------------------ tiny zoo builds shared by the whole session

@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory):
    """$SPECMM_HOME for the session's tiny zoo builds (one folder shared by all parallel workers)."""
    if WORKER:
        shared = tmp_path_factory.getbasetemp().parent / "zoo-home"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("zoo-home")


@pytest.fixture
def tiny_zoo(zoo_home, monkeypatch):
    """`tiny_zoo(name)` -> the folder of the tiny build of `name` (built once per session, on first use); $SPECMM_HOME
    points at the session's zoo for the test, so commands that call `zoo.build` themselves find the same builds."""
    from specmm import zoo

    monkeypatch.setenv("SPECMM_HOME", str(zoo_home))

    def build(name: str) -> Path:
        with open(zoo_home / f".{name}.test-wait", "w") as wait:  # a worker waits while another builds `name`
            fcntl.flock(wait, fcntl.LOCK_EX)
            return zoo.build(name, "tiny", progress=False)

    return build


# ------------------------------------------------------------------ acceptance report in the test output

ACCEPTANCE_REPORT: list[tuple[str, float, list[int]]] = []


def report_acceptance(case: str, stats) -> None:
    """Record a case's mean accepted length and histogram for the end-of-run summary."""
    ACCEPTANCE_REPORT.append((case, stats.mean_accepted, stats.accepted_histogram))


def pytest_configure(config):
    if not WORKER and "SPECMM_TEST_REPORTS" not in os.environ:  # the controller: workers inherit the folder
        folder = os.environ["SPECMM_TEST_REPORTS"] = tempfile.mkdtemp(prefix="specmm-acceptance-")

        def remove() -> None:  # after the terminal summary has read the workers' reports
            shutil.rmtree(folder, ignore_errors=True)
            del os.environ["SPECMM_TEST_REPORTS"]
        config.add_cleanup(remove)


def pytest_sessionfinish(session):
    if WORKER and ACCEPTANCE_REPORT:
        folder = Path(os.environ["SPECMM_TEST_REPORTS"])
        (folder / f"{WORKER}.json").write_text(json.dumps(ACCEPTANCE_REPORT))


def pytest_terminal_summary(terminalreporter):
    rows = list(ACCEPTANCE_REPORT)
    folder = Path(os.environ.get("SPECMM_TEST_REPORTS", ""))
    if folder.name:
        for part in sorted(folder.glob("*.json")):
            rows += [tuple(row) for row in json.loads(part.read_text())]
    if not rows:
        return
    terminalreporter.section("acceptance reached (mean tokens per target forward; histogram of accepted drafts)")
    for case, mean, histogram in sorted(rows):
        terminalreporter.write_line(f"{case:<44} {mean:6.3f}  {histogram}")


FORKING_TESTS = ("tests/cli/test_kill_resume.py", "tests/vlm/test_ddp.py")


def pytest_collection_modifyitems(session, config, items):
    """Fault-injection tests fork the test process; a fork is safe only before the process has run autograd's
    worker threads or torch.compile (a forked child then fails in backward or hangs), so they run first. Under
    `make test`'s parallel workers each forking file is the first file of a worker (xdist hands the first files
    out one per worker, in this order)."""
    first = [item for item in items if item.nodeid.startswith(FORKING_TESTS)]
    items[:] = first + [item for item in items if not item.nodeid.startswith(FORKING_TESTS)]
