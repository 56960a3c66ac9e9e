"""Compiled mode on VLM targets: LLaVA, Qwen2.5-VL (M-RoPE) and Gemma 3 (bidirectional image blocks) with the
VisionDrafter methods give the stock `generate` tokens (DREAM's prefill reads the last layer's attention through
the static cache's whole-buffer mask). Graphs are captured on the suite's capture backend (see
tests/core/test_compiled.py). Qwen2.5-VL's methods and LLaVA's ViSpec are checked against the same stock tokens
under CUDA graphs' rules, in `tests/core/test_resident.py`: each compiled case is seconds of graph tracing."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.core.static_cache import StaticRowCache
from tests.vlm.test_drafter import SPECS, drafter_for
from tests.vlm.test_targets import MAX_NEW, PAD, setup


@pytest.mark.parametrize("family, method", [("llava", "eagle"), ("llava", "dream")])
def test_compiled_greedy_tokens_equal_stock_generate(family, method, capture_only):
    model, inputs, eos, reference = setup(family)
    gen = specmm.SpeculativeGenerator(model, drafter_for(model, method), tree=SPECS["dynamic"], compile=True)
    out = gen.generate(**inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    assert torch.equal(out.sequences, reference)
    assert gen.whole_round  # rounds after the first: one graph over drafter head, target and bookkeeping
    roots = gen.begin(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW,
                      **{k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")})
    assert isinstance(gen.target.runner.cache, StaticRowCache) and isinstance(gen.drafter.runner.cache, StaticRowCache)
    assert roots.shape[0] == inputs["input_ids"].shape[0]
    gen.end()


def test_compiled_gemma3_bidirectional_prefill_equals_stock_generate(capture_only):
    """Gemma 3's image-block prefill mask through the static caches (sliding and full layers)."""
    from tests.vlm.test_families import SPEC
    from tests.vlm.test_families import setup as family_setup

    model, inputs, eos, reference = family_setup("gemma3")
    gen = specmm.SpeculativeGenerator(model, drafter_for(model, "vispec"), tree=SPEC, compile=True)
    out = gen.generate(**inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    assert torch.equal(out.sequences, reference)
