"""Zoo entry `ssm-code` at tiny scale: deterministic for a seed, and the targets load and decode with STree."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm import zoo
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget
from specmm.zoo import code, ssm_code, store
from tests.ssm.conftest import one_cpu_thread  # noqa: F401 (autouse fixture: tiny convs crawl on contended threads)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_ssm_code_builds_deterministically_and_its_targets_decode_losslessly(home, monkeypatch, tmp_path):
    dest = zoo.build("ssm-code", "tiny", progress=False)
    hashes = {k: v["sha256"] for k, v in store.read_manifest(dest)["files"].items()}
    assert {"mamba2/model.safetensors", "hybrid/model.safetensors"} <= set(hashes)
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "other"))
    again = zoo.build("ssm-code", "tiny", progress=False)
    assert {k: v["sha256"] for k, v in store.read_manifest(again)["files"].items()} == hashes

    draft = code.load(zoo.path("code", "tiny")).draft
    for role in ssm_code.ROLES:
        target, tokenizer, prompts = ssm_code.load(dest, role)
        assert type(target).__name__ == zoo.record("ssm-code", "tiny")["models"][role]["class"]
        batch = tokenizer(prompts[:2], return_tensors="pt", padding=True)
        out = specmm.SpeculativeGenerator(SSMTarget(target), ModelDrafter(draft),
                                          tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6)).generate(
            batch["input_ids"], batch["attention_mask"], max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)
        for row, prompt in enumerate(prompts[:2]):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            reference = target.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                        pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
            assert torch.equal(out.sequences[row, batch["input_ids"].shape[1]:], reference)
    with pytest.raises(ValueError, match="role"):
        ssm_code.load(dest, "transformer")
