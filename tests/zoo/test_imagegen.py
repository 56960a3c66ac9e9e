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
