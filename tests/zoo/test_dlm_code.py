"""Zoo entry dlm-code at tiny scale: deterministic, LLaDA-layout folder, mask token appended, decodes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from specmm import zoo
from specmm.diffusion_lm import generate
from specmm.zoo import dlm_code, store
from tests.conftest import one_torch_thread


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def test_tiny_build_is_deterministic_loads_and_ssd_matches_stepwise(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "a"))
    first = store.read_manifest(zoo.build("dlm-code", "tiny", progress=False))["files"]
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "b"))
    path = zoo.build("dlm-code", "tiny", progress=False)
    assert store.read_manifest(path)["files"] == first
    config = json.loads((path / "model" / "config.json").read_text())
    assert config["model_type"] == "llada" and config["mask_token_id"] == config["vocab_size"] - 1
    entry = dlm_code.load(path, dtype=torch.float64)
    assert entry.tokenizer.mask_token_id == entry.model.mask_id
    ids = torch.tensor(entry.prompt_ids[:2])
    ref = generate(entry.model, ids, 16, 8, method="stepwise")
    out = generate(entry.model, ids, 16, 8, method="ssd", draft_size=4)
    assert torch.equal(out.sequences, ref.sequences)
    assert zoo.record("dlm-code", "tiny")["model"]["heldout_diffusion_loss"] > 0
