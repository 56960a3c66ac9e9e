"""Zoo entry `imagegen` at micro scale: deterministic, resumable, loads in upstream layout, samples losslessly."""

from __future__ import annotations

import pytest
import torch

from specmm import zoo
from specmm.image_ar import ImageSampler
from specmm.zoo import imagegen, store


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def hashes(path) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in store.read_manifest(path)["files"].items()}


def test_build_is_deterministic_and_resumes_after_a_kill(home, monkeypatch, tmp_path):
    first = hashes(zoo.build("imagegen", "tiny", progress=False))
    assert {"gpt.pt", "vq.pt", "gpt_config.json", "drafter/model.safetensors", "classifier.pt"} <= set(first)
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "killed"))
    real = imagegen._resumable

    def killed_in_gpt_stage(name, *args, **kwargs):
        if name == "gpt":
            raise KeyboardInterrupt("simulated kill")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(imagegen, "_resumable", killed_in_gpt_stage)
    with pytest.raises(KeyboardInterrupt):
        zoo.build("imagegen", "tiny", progress=False)
    assert (store.entry_dir("imagegen", "tiny") / "work" / "vq.pt").is_file()
    monkeypatch.setattr(imagegen, "_resumable", real)
    assert hashes(zoo.build("imagegen", "tiny", progress=False)) == first
    assert zoo.record("imagegen", "tiny")["resumed_from_checkpoint"] is True


def test_built_entry_loads_and_samples_like_ar(home):
    models = imagegen.load(zoo.build("imagegen", "tiny", progress=False))
    record = zoo.record("imagegen", "tiny")
    assert record["tokens_per_image"] == models.lg.config.block_size == 64
    classes = torch.tensor([0, 7])
    ar = ImageSampler(models.lg, proposer="ar").sample(classes, cfg_scale=2.0, temperature=0.0)
    spec = ImageSampler(models.lg, proposer=models.drafter).sample(classes, cfg_scale=2.0, temperature=0.0)
    assert torch.equal(ar.tokens, spec.tokens)
    feats, logits = models.judge(ar.images)
    assert logits.shape == (2, len(models.classes)) and feats.shape[0] == 2


def test_bfloat16_recipe_trains_every_stage_under_autocast_and_saves_float32(home, monkeypatch):
    """A recipe's `precision: bfloat16` (the gpu recipe's) runs each stage's loss under autocast on its `device`;
    the artifacts stay float32 on the CPU and sample losslessly."""
    bf16 = {**imagegen.RECIPES["tiny"], "device": "cpu", "precision": "bfloat16"}
    monkeypatch.setitem(imagegen.RECIPES, "tiny", bf16)
    autocast = {}
    real = imagegen._resumable

    def watched(name, work, module, steps, lr, loss_fn, *args, **kwargs):
        def loss(step):
            autocast[name] = torch.is_autocast_enabled("cpu")
            return loss_fn(step)
        return real(name, work, module, steps, lr, loss, *args, **kwargs)

    monkeypatch.setattr(imagegen, "_resumable", watched)
    models = imagegen.load(zoo.build("imagegen", "tiny", progress=False))
    assert autocast == {"vq": True, "gpt": True, "drafter": True, "classifier": True}
    assert {p.dtype for p in models.lg.parameters()} == {torch.float32}
    classes = torch.tensor([2, 5])
    ar = ImageSampler(models.lg, proposer="ar").sample(classes, cfg_scale=2.0, temperature=0.0, decode=False)
    spec = ImageSampler(models.lg, proposer=models.drafter).sample(classes, cfg_scale=2.0, temperature=0.0,
                                                                  decode=False)
    assert torch.equal(ar.tokens, spec.tokens)
