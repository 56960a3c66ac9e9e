"""Zoo recipes at micro scale: deterministic, resumable, reloadable, and corrupt builds are rebuilt."""

from __future__ import annotations

import json

import pytest
import torch

import specmm
from specmm import zoo
from specmm.drafters import ModelDrafter
from specmm.zoo import captioner, code, store

ENTRIES = {"code": code, "captioner": captioner}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def weight_hashes(path) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in store.read_manifest(path)["files"].items()}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_build_is_deterministic_for_a_seed(home, monkeypatch, tmp_path, name):
    first = weight_hashes(zoo.build(name, "tiny", progress=False))
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "other"))
    second = weight_hashes(zoo.build(name, "tiny", progress=False))
    assert first == second and any(k.endswith("model.safetensors") for k in first)
    third = weight_hashes(zoo.build(name, "tiny", seed=1, force=True, progress=False))
    assert third["target/model.safetensors"] != first["target/model.safetensors"]


@pytest.mark.parametrize("name", list(ENTRIES))
def test_resume_after_a_kill_gives_the_weights_of_an_uninterrupted_build(home, monkeypatch, tmp_path, name):
    uninterrupted = weight_hashes(zoo.build(name, "tiny", progress=False))
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "killed"))
    module = ENTRIES[name]
    real_train = module.train_causal_lm

    def killed_at_step_3(model, batches, config, workdir, **kw):
        def after_step(step):
            if step == 3 and workdir.name == "target":
                raise KeyboardInterrupt("simulated kill")
        return real_train(model, batches, config, workdir, after_step=after_step, **kw)

    monkeypatch.setattr(module, "train_causal_lm", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        zoo.build(name, "tiny", progress=False)
    dest = store.entry_dir(name, "tiny")
    assert (dest / "work" / "target" / "checkpoint.pt").is_file() and store.problems(dest)
    monkeypatch.setattr(module, "train_causal_lm", real_train)
    with pytest.raises(FileNotFoundError, match=f"specmm zoo build {name}"):
        zoo.path(name, "tiny")
    resumed = weight_hashes(zoo.build(name, "tiny", progress=False))
    assert resumed == uninterrupted
    assert zoo.record(name, "tiny")["resumed_from_checkpoint"] is True


def test_built_entry_reloads_with_from_pretrained_and_generates(home):
    path = zoo.build("code", "tiny", progress=False)
    record = json.loads((path / "zoo.json").read_text())
    for key in ("recipe", "seed", "wall_time_s", "machine", "greedy_agreement"):
        assert key in record
    assert record["models"]["draft"]["parameters"] < record["models"]["target"]["parameters"]
    models = code.load(path)
    ids, mask = (lambda e: (e["input_ids"], e["attention_mask"]))(
        models.tokenizer(models.prompts[:2], return_tensors="pt", padding=True))
    reference = models.target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10,
                                       pad_token_id=models.tokenizer.pad_token_id, eos_token_id=None)
    out = specmm.SpeculativeGenerator(models.target, ModelDrafter(models.draft),
                                      tree=specmm.TreeSpec.chain(3)).generate(
        ids, attention_mask=mask, max_new_tokens=10, pad_token_id=models.tokenizer.pad_token_id)
    assert torch.equal(out.sequences, reference)


def test_built_captioner_reloads_and_captions_a_scene(home):
    path = zoo.build("captioner", "tiny", progress=False)
    record = zoo.record("captioner", "tiny")
    assert {"fact_precision", "fact_recall", "relation_accuracy"} <= set(record["quality"])
    models = captioner.load(path)
    assert models.processor.tokenizer.image_token == "<image>"
    captions = captioner.caption_scenes(models.target, models.processor, [1, 2], models.image_size, 8)
    assert len(captions) == 2 and all(isinstance(c, str) for c in captions)
    enc = models.processor(images=[captioner.scenes.render(captioner.scene_and_caption(1)[0], models.image_size)],
                           text=[captioner.PROMPT], return_tensors="pt")
    assert (enc["input_ids"] == models.target.config.image_token_id).sum() == record["image_tokens"]
    draft_out = models.draft.generate(enc["input_ids"], do_sample=False, max_new_tokens=4,
                                      pad_token_id=models.processor.tokenizer.pad_token_id)
    assert draft_out.shape[1] == enc["input_ids"].shape[1] + 4


@pytest.mark.parametrize("damage", ["delete-manifest", "truncate-weights", "flip-bytes", "half-written-manifest"])
def test_corrupt_or_half_written_builds_are_detected_and_rebuilt(home, damage):
    path = zoo.build("code", "tiny", progress=False)
    good = weight_hashes(path)
    weights = path / "target" / "model.safetensors"
    if damage == "delete-manifest":
        (path / "zoo.json").unlink()
    elif damage == "truncate-weights":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "flip-bytes":
        data = bytearray(weights.read_bytes())
        data[-10] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (path / "zoo.json").write_text('{"complete": tr')
    assert store.problems(path)
    rebuilt = zoo.build("code", "tiny", progress=False)
    assert not store.problems(rebuilt) and weight_hashes(rebuilt) == good


def test_a_build_from_an_older_recipe_is_not_loaded_but_rebuilt(home, monkeypatch):
    path = zoo.build("code", "tiny", progress=False)
    recipe = {**zoo.get("code").recipes["tiny"], "vocab_size": zoo.get("code").recipes["tiny"]["vocab_size"] + 8}
    monkeypatch.setitem(zoo.get("code").recipes, "tiny", recipe)
    with pytest.raises(FileNotFoundError, match="different recipe"):
        zoo.path("code", "tiny")
    assert zoo.build("code", "tiny", progress=False) == path and zoo.record("code", "tiny")["recipe"] == recipe


def test_unknown_entry_or_scale_is_refused(home):
    with pytest.raises(ValueError, match="unknown zoo entry"):
        zoo.build("nope")
    with pytest.raises(ValueError, match="scale"):
        zoo.build("code", "huge")


def test_a_seed_is_its_own_build_and_never_returns_another_seeds(home, capsys):
    from specmm.cli import main

    zero = zoo.build("code", "tiny", progress=False)
    assert main(["zoo", "build", "code", "--scale", "tiny", "--seed", "5"]) == 0
    five = store.entry_dir("code", "tiny", 5)
    assert capsys.readouterr().out.strip().endswith(str(five)) and five != zero
    assert zoo.record("code", "tiny", seed=5)["seed"] == 5 and zoo.record("code", "tiny")["seed"] == 0
    weights = "target/model.safetensors"
    assert weight_hashes(five)[weights] != weight_hashes(zero)[weights]
    stamp = (five / "zoo.json").stat().st_mtime_ns
    assert zoo.build("code", "tiny", seed=5, progress=False) == five and (five / "zoo.json").stat().st_mtime_ns == stamp
    with pytest.raises(FileNotFoundError, match="run: specmm zoo build code --scale tiny --seed 7"):
        zoo.path("code", "tiny", seed=7)


def test_a_build_recorded_with_another_seed_is_not_returned_for_this_one(home):
    path = zoo.build("code", "tiny", progress=False)
    record = json.loads((path / "zoo.json").read_text())
    (path / "zoo.json").write_text(json.dumps({**record, "seed": 3}))  # what `--seed 3 --force` used to leave here
    with pytest.raises(FileNotFoundError, match="built with seed 3, not 0"):
        zoo.path("code", "tiny")


def test_zoo_path_checks_every_file_like_build_does(home, capsys):
    from specmm.cli import main

    path = zoo.build("code", "tiny", progress=False)
    weights = path / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # same size, other content
    weights.write_bytes(bytes(data))
    assert main(["zoo", "path", "code", "--scale", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "specmm: error: zoo entry 'code' (tiny) is not built" in err and "sha256 mismatch" in err
    assert "run: specmm zoo build code --scale tiny" in err
    assert zoo.path("code", "tiny") == path  # loaders keep the quick size check


def test_a_second_concurrent_build_is_refused(home):
    from specmm.jobs import JobLockedError, OutputLock

    dest = store.entry_dir("code", "tiny")
    with OutputLock(store.lock_path(dest)):
        with pytest.raises(JobLockedError,
                           match=r"zoo build: .*code-tiny is being written by another specmm job \(PID"):
            zoo.build("code", "tiny", progress=False)
