"""Compiled mode on inductor's own kernels (the rest of the suite only captures graphs): a ragged batch
with EOS through the dynamic tree, and the C++ wrapper (compiled mode's default on a CPU machine) through a chain
and HF's static baseline. Two tests only: each graph costs seconds of C++ compile on a fresh machine."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.core.compiled import GRAPHED
from specmm.drafters import ModelDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model
from tests.core.test_compiled import TREE_KINDS, ragged_batch_with_eos_equals_generate


def test_inductor_kernels_decode_a_ragged_batch_with_eos_as_generate(inductor):
    ragged_batch_with_eos_equals_generate("llama", "dynamic", TREE_KINDS["dynamic"])


def test_compiled_rounds_under_the_cpp_wrapper_equal_generate_and_so_does_hfs_static_baseline(inductor, monkeypatch):
    """Compiled mode's default on a CPU machine: inductor's C++ wrapper, for specmm's graphs and the HF baseline (a
    chain, whose round masks are constants: their gather once made C++ that did not compile)."""
    from specmm.bench.fast_path import hf_compile_scope, hf_compiled, hf_static_compile_kwargs
    from specmm.core import compiled

    monkeypatch.setattr(compiled, "CPP_WRAPPER", True)
    if torch.cuda.is_available():
        pytest.skip("the C++ wrapper is compiled mode's default only without CUDA")
    assert compiled.inductor_options(None) == {"cpp_wrapper": True} and compiled.inductor_options(GRAPHED) == {}
    target = tiny_model("llama")
    ids, mask = left_padded_batch([4, 7], seed=3)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=TREE_KINDS["chain"],
                                      compile=True)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(out.sequences, reference) and gen.whole_round
    with hf_compile_scope(target):
        kwargs = hf_static_compile_kwargs(target)
        assert kwargs["compile_config"].options == {"cpp_wrapper": True}
        baseline = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0,
                                   **kwargs)
        assert hf_compiled(target)
    assert torch.equal(baseline, reference)
