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


def _assert_greedy(target, draft, tokenizer, prompts: list[str], tree: specmm.TreeSpec, new_tokens: int) -> None:
    """STree over the left-padded batch gives each prompt's own HF greedy continuation."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = specmm.SpeculativeGenerator(SSMTarget(target), ModelDrafter(draft), tree=tree).generate(
        batch["input_ids"], batch["attention_mask"], max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
    for row, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        reference = target.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
        assert torch.equal(out.sequences[row, batch["input_ids"].shape[1]:], reference)


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
        tree = specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6)
        _assert_greedy(target, draft, tokenizer, prompts[:2], tree, 6)
    with pytest.raises(ValueError, match="role"):
        ssm_code.load(dest, "transformer")


def test_ssm_code_drafts_distil_the_code_draft_onto_each_target_and_stay_lossless(home):
    dest = zoo.build("ssm-code-drafts", "tiny", progress=False)
    record = zoo.record("ssm-code-drafts", "tiny")
    code_draft = code.load(zoo.path("code", "tiny")).draft
    for role in ssm_code.ROLES:
        figures = record["drafts"][role]
        assert figures["heldout_kl"] < figures["heldout_kl_before"]  # distillation moved it towards this target
        draft = ssm_code.load_draft(dest, role)
        assert any(not torch.equal(a, b) for a, b in zip(draft.state_dict().values(),
                                                         code_draft.state_dict().values()))
        target, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", "tiny"), role)
        _assert_greedy(target, draft, tokenizer, prompts[:2], specmm.TreeSpec.chain(2), 5)
    with pytest.raises(ValueError, match="role"):
        ssm_code.load_draft(dest, "transformer")
