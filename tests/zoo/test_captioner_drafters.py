"""Zoo entry `captioner-drafters` at micro scale: every method is trained, saved, reloads and stays lossless."""

from __future__ import annotations

import torch

import specmm
from specmm import zoo
from specmm.vlm import METHODS, VisionDrafter
from specmm.zoo import captioner


def test_every_method_builds_reloads_and_decodes_like_the_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path))
    path = zoo.build("captioner-drafters", "tiny", progress=False)
    record = zoo.record("captioner-drafters", "tiny")
    assert set(record["methods"]) == set(METHODS)
    models = captioner.load(zoo.path("captioner", "tiny"))
    seeds = [5, 6]
    images = [captioner.scenes.render(captioner.scene_and_caption(s)[0], models.image_size, seed=s) for s in seeds]
    models.processor.tokenizer.padding_side = "left"
    enc = dict(models.processor(images=images, text=[captioner.PROMPT] * 2, return_tensors="pt", padding=True))
    pad = models.processor.tokenizer.pad_token_id
    reference = models.target.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=pad, eos_token_id=None)
    for method in METHODS:
        stats = record["methods"][method]
        assert stats["multimodal"]["final_loss"] is not None and stats["parameters"] > 0
        drafter = VisionDrafter.from_pretrained(path / method, models.target)
        assert drafter.method == method
        out = specmm.SpeculativeGenerator(models.target, drafter, tree=specmm.TreeSpec.dynamic(2, 2, 4)).generate(
            **enc, max_new_tokens=6, pad_token_id=pad)
        assert torch.equal(out.sequences, reference), method
    # the demo's single-method entry trains ViSpec by the same code and seed: at the same (tiny) recipe, the same losses
    zoo.build("captioner-vispec", "tiny", progress=False)
    alone = zoo.record("captioner-vispec", "tiny")["methods"]
    assert set(alone) == {"vispec"}
    for stage in ("text", "multimodal"):
        for key in ("first_loss", "final_loss"):
            assert abs(alone["vispec"][stage][key] - record["methods"]["vispec"][stage][key]) < 1e-4
