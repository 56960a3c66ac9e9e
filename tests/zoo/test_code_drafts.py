"""Zoo entry `code-drafts` at tiny scale: deterministic for a seed; its EAGLE head and distilled draft decode the
`code` target losslessly; the recorded EAGLE agreement reads the positions drafting would."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm import zoo
from specmm.drafters import EagleDrafter, ModelDrafter
from specmm.zoo import code, code_drafts, store


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_code_drafts_build_deterministically_and_decode_the_code_target_losslessly(home, monkeypatch, tmp_path):
    dest = zoo.build("code-drafts", "tiny", progress=False)
    hashes = {k: v["sha256"] for k, v in store.read_manifest(dest)["files"].items()}
    assert {"eagle/model.safetensors", "distilled/model.safetensors"} <= set(hashes)
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "other"))
    again = {k: v["sha256"] for k, v in store.read_manifest(zoo.build("code-drafts", "tiny", progress=False))["files"]
             .items()}
    assert again == hashes, [k for k in hashes if hashes[k] != again.get(k)]  # byte for byte: see save_pretrained

    models = code.load(zoo.path("code", "tiny"))
    record = zoo.record("code-drafts", "tiny")["drafters"]
    assert record["distilled"]["heldout_kl"] < record["distilled"]["heldout_kl_before"]
    eagle = code_drafts.load(dest, "eagle", models.target)
    distilled = code_drafts.load(dest, "distilled", models.target)
    assert isinstance(eagle, EagleDrafter)
    models.tokenizer.padding_side = "left"
    batch = models.tokenizer(models.prompts[:2], return_tensors="pt", padding=True)
    for drafter in (eagle, ModelDrafter(distilled)):
        out = specmm.SpeculativeGenerator(models.target, drafter, tree=specmm.TreeSpec.chain(3)).generate(
            batch["input_ids"], batch["attention_mask"], max_new_tokens=6, pad_token_id=models.tokenizer.pad_token_id)
        for row in range(2):
            ids = batch["input_ids"][row][batch["attention_mask"][row].bool()][None]
            reference = models.target.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                               pad_token_id=models.tokenizer.pad_token_id)[0, ids.shape[1]:]
            assert torch.equal(out.sequences[row, batch["input_ids"].shape[1]:], reference)
    with pytest.raises(ValueError, match="which"):
        code_drafts.load(dest, "medusa", models.target)


def test_eagle_agreement_scores_each_new_position_from_the_features_before_it():
    """The batched agreement equals the position-by-position reading: the head's prediction from pairs up to the
    one ending at token j-1 (feature f_{j-2}) against the target's greedy token j, for every new position j."""
    from specmm.core.eagle_train import target_features
    from tests.conftest import tiny_model

    torch.manual_seed(0)
    target = tiny_model("llama", dtype=torch.float32).eval()
    drafter = EagleDrafter.for_target(target)
    torch.nn.init.normal_(drafter.head.fc.weight, std=0.5)  # a head whose drafts vary with their inputs
    prompts = torch.randint(1, target.config.vocab_size, (2, 5))
    new = 6
    agreement = code_drafts.eagle_agreement(drafter, target, prompts, new)

    with torch.no_grad():
        out = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=0)
        features = target_features(target, out, torch.ones_like(out))
        hits = []
        for j in range(prompts.shape[1], out.shape[1]):
            hidden = drafter.head(drafter.embed_tokens(out[:, 1:j]), features[:, : j - 1]).last_hidden_state
            hits.append(drafter.lm_head(hidden[:, -1]).argmax(-1) == out[:, j])
    assert agreement == pytest.approx(torch.stack(hits).float().mean().item())
