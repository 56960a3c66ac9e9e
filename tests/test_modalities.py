"""`import specmm` is fast and imports no modality package, yet every modality is reachable as `specmm.<name>` and
every target adapter (VLM, SSM) is found by `as_target` before its package is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch import nn
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Mamba2Config,
    Mamba2ForCausalLM,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

import specmm
from specmm.modalities import MODALITIES, SSM_MODEL_CLASSES, TARGET_ADAPTERS

REPO = Path(__file__).resolve().parents[1]
_TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)


def tiny_llava() -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2)
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=LlamaConfig(**_TEXT),
                                                     image_token_id=95, vision_feature_layer=-1))


def tiny_qwen2_vl() -> Qwen2VLForConditionalGeneration:
    """A VLM class the VLM adapter does not support."""
    text = dict(_TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1]})
    vision = dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=4)
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision))


def tiny_mamba2() -> Mamba2ForCausalLM:
    return Mamba2ForCausalLM(Mamba2Config(vocab_size=64, hidden_size=16, expand=2, num_heads=4, head_dim=8, n_groups=2,
                                          state_size=8, conv_kernel=4, chunk_size=8, num_hidden_layers=1,
                                          pad_token_id=0))


def tiny_llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(**_TEXT))


def _run(code: str) -> dict:
    """Run `code` in a fresh interpreter (repo on the path, one thread); it prints one JSON object."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_specmm_takes_under_a_second_and_imports_no_modality():
    result = _run("""
import json, sys, time
start = time.perf_counter()
import torch, transformers
from transformers import DynamicCache  # the one transformers class specmm.core imports at module level
baseline = time.perf_counter()
import specmm
done = time.perf_counter()
print(json.dumps({"baseline_s": baseline - start, "specmm_s": done - baseline,
                  "modules": sorted(m for m in sys.modules if m.startswith("specmm."))}))
""")
    loaded = {m.split(".")[1] for m in result["modules"]}
    assert not loaded & {*MODALITIES, "zoo", "bench", "cli", "demo"}, result["modules"]
    assert result["specmm_s"] < 1.0, result


def test_modalities_are_reachable_as_attributes():
    for name in MODALITIES:
        assert getattr(specmm, name).__name__ == f"specmm.{name}"
        assert name in dir(specmm)
    assert specmm.image_ar.LlamaGen.__name__ == "LlamaGen"
    assert specmm.vlm.VisionDrafter.__name__ == "VisionDrafter"
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        specmm.nonexistent  # noqa: B018


def test_as_target_finds_vlm_and_ssm_adapters_without_importing_their_packages():
    result = _run("""
import json, sys
import torch
import specmm
from specmm.core import as_target
from tests.test_modalities import tiny_llama, tiny_llava, tiny_mamba2

def loaded():
    return sorted(m for m in ("specmm.vlm", "specmm.ssm") if m in sys.modules)

out = {}
out["llama"] = [type(as_target(tiny_llama())).__name__, loaded()]
out["llava"] = [type(as_target(tiny_llava())).__name__, loaded()]
out["llava_is_vlm_target"] = isinstance(as_target(tiny_llava()), specmm.vlm.VLMTarget)
out["mamba2"] = [type(as_target(tiny_mamba2())).__name__, loaded()]
out["mamba2_is_ssm_target"] = isinstance(as_target(tiny_mamba2()), specmm.ssm.SSMTarget)
print(json.dumps(out))
""")
    assert result["llama"] == ["HFCausalLMTarget", []]  # a text LM imports no modality
    assert result["llava"] == ["LlavaTarget", ["specmm.vlm"]]
    assert result["llava_is_vlm_target"]
    assert result["mamba2"] == ["SSMTarget", ["specmm.ssm", "specmm.vlm"]]
    assert result["mamba2_is_ssm_target"]


def test_ssm_class_names_equal_the_ssm_package_lists():
    from specmm.ssm.target import STATEFUL_MODELS, SUPPORTED_MODELS

    assert SSM_MODEL_CLASSES == set(SUPPORTED_MODELS + STATEFUL_MODELS)


@pytest.mark.parametrize("adapter", TARGET_ADAPTERS, ids=lambda a: a.module)
def test_cheap_matcher_agrees_with_the_package_matcher(adapter):
    import importlib

    package_matches = getattr(importlib.import_module(adapter.module), adapter.matcher)
    models = [tiny_llava(), tiny_qwen2_vl(), tiny_mamba2(), tiny_llama(), nn.Linear(2, 2)]
    others = [None, SimpleNamespace(config=SimpleNamespace(vision_config={})), type("Mamba2ForCausalLM", (), {})()]
    for model in models + others:
        assert adapter.matches(model) == package_matches(model), type(model).__name__
    assert any(adapter.matches(model) for model in models)  # each matcher recognises one of the models
