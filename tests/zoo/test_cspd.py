"""Zoo entry `cspd` at tiny scale: resumable and deterministic, loads, and its models work with CSpD."""

from __future__ import annotations

import pytest
import torch

from specmm import zoo
from specmm.image_ar.continuous import CSpDSampler
from specmm.image_ar.continuous.latents import decode
from specmm.zoo import cspd, store


def weight_hashes(path) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in store.read_manifest(path)["files"].items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECMM_HOME", str(tmp_path_factory.mktemp("home")))
        yield zoo.build("cspd", "tiny", progress=False)


def test_resumed_build_has_the_weights_of_an_uninterrupted_one(built, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path))
    real_train = cspd.train_causal_lm

    def killed_at_step_2(model, batches, config, workdir, **kw):
        def after_step(step):
            if step == 2 and workdir.name == "target":
                raise KeyboardInterrupt("simulated kill")
        return real_train(model, batches, config, workdir, after_step=after_step, **kw)

    monkeypatch.setattr(cspd, "train_causal_lm", killed_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        zoo.build("cspd", "tiny", progress=False)
    assert (store.entry_dir("cspd", "tiny") / "work" / "target" / "checkpoint.pt").is_file()
    monkeypatch.setattr(cspd, "train_causal_lm", real_train)
    resumed = weight_hashes(zoo.build("cspd", "tiny", progress=False))
    assert resumed == weight_hashes(built)
    assert {"vae/diffusion_pytorch_model.safetensors", "target/model.safetensors", "draft/model.safetensors",
            "classifier/classifier.safetensors"} <= set(resumed)


def test_loaded_models_decode_and_speculate(built):
    models = cspd.load(built)
    record = store.read_manifest(built)
    target, draft = models["target"], models["draft"]
    assert target.config.grid == 16 // 4 and target.config.token_dim == 2
    assert models["vae"].config.scaling_factor == pytest.approx(record["vae"]["scaling_factor"])
    out = CSpDSampler(target, draft, draft_tokens=3).sample(torch.arange(3), generator=torch.Generator().manual_seed(0))
    images = decode(models["vae"], out.tokens)
    assert images.shape == (3, 3, 16, 16) and images.dtype == torch.uint8
    assert models["classifier"].features(images).shape[0] == 3


def test_draft_shares_the_targets_frozen_head_and_is_distilled_on_target_samples(built):
    models, record = cspd.load(built), store.read_manifest(built)
    target_head, draft_head = models["target"].head.state_dict(), models["draft"].head.state_dict()
    assert all(torch.equal(target_head[name], draft_head[name]) for name in target_head)
    assert record["distill_samples"] == 6 and record["draft"]["steps"] == cspd.RECIPES["tiny"]["distill_train"]["steps"]


def test_target_samples_are_class_balanced_and_reused_on_resume(built, tmp_path):
    target = cspd.load(built)["target"]
    samples = cspd.target_samples(target, 12, tmp_path / "samples.pt", seed=0, batch_size=5)
    assert samples["latents"].shape == (12, 16, 2) and samples["labels"].tolist() == [*range(10), 0, 1]
    again = cspd.target_samples(target, 12, tmp_path / "samples.pt", seed=1)  # a resumed build: same file
    assert torch.equal(again["latents"], samples["latents"])


def test_share_head_rejects_a_draft_of_another_shape():
    tiny = cspd.RECIPES["tiny"]
    target = cspd.ContinuousAR(cspd.model_config(tiny, "target"))
    other = cspd.ContinuousAR(cspd.model_config({**tiny, "draft": {**tiny["draft"], "hidden_size": 8}}, "draft"))
    with pytest.raises(ValueError, match="hidden_size"):
        cspd.share_head(other, target)
