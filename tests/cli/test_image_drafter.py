"""`specmm train-image-drafter` on a saved tiny Janus and on upstream LlamaGen checkpoints: the drafter
`train_image_drafter` gives, killed runs resume from what they kept (sampled slices, checkpoints) to the same
weights, other jobs are refused, bad input too."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specmm.image_ar.drafter_train as drafter_train
from specmm.cli import main
from specmm.image_ar import image_model_for
from specmm.image_ar.drafter_train import DrafterTrainConfig, train_image_drafter
from specmm.image_ar.models import load_pretrained
from tests.image_ar.stock import janus_processor, tiny_janus

PROMPTS = ["a red cat", "a blue dog under the tree", "green sky", "a small mat", "big tree"]


@pytest.fixture
def janus(tmp_path):
    folder = tmp_path / "janus"
    tiny_janus(dtype=torch.float32).save_pretrained(folder)
    janus_processor().save_pretrained(folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return folder, prompts


def args(folder, prompts, out, *extra):
    return ["train-image-drafter", "--model", str(folder), "--prompts", str(prompts), "--out", str(out), "--steps",
            "4", "--batch-size", "4", "--checkpoint-every", "2", "--sample-batch-size", "2", "--cfg-scale", "1.5",
            "--seed", "3", "--device", "cpu", *extra]


def fail_on_call(monkeypatch, name: str, call: int, counter: list):
    """Make `drafter_train.<name>` raise on its `call`-th call (1-based), counting calls in `counter`."""
    real = getattr(drafter_train, name)

    def wrapped(*a, **kw):
        counter.append(name)
        if len(counter) == call:
            raise RuntimeError("killed")
        return real(*a, **kw)

    monkeypatch.setattr(drafter_train, name, wrapped)


def test_killed_runs_resume_to_the_librarys_drafter(janus, tmp_path, monkeypatch):
    folder, prompts = janus
    model, processor = load_pretrained(folder)
    expected = train_image_drafter(image_model_for(model, processor), PROMPTS, cfg_scale=1.5, seed=3, progress=False,
                                   config=DrafterTrainConfig(steps=4, batch_size=4, lr=1e-3)).head.state_dict()
    out = tmp_path / "drafter"
    with monkeypatch.context() as patch:  # killed while sampling its second slice of prompts
        sampled: list = []
        fail_on_call(patch, "sample_training_tokens", 2, sampled)
        with pytest.raises(RuntimeError, match="killed"):
            main(args(folder, prompts, out))
    assert sorted(p.name for p in (out / "work").iterdir()) == ["codes-000000.pt"]
    with monkeypatch.context() as patch:  # resumed, samples the two slices left, killed at step 2 (saved: step 1)
        sampled, steps = [], []
        patch.setattr(drafter_train, "sample_training_tokens",
                      lambda *a, _real=drafter_train.sample_training_tokens, **kw: sampled.append(1) or _real(*a, **kw))
        fail_on_call(patch, "model_drafter_loss", 3, steps)
        with pytest.raises(RuntimeError, match="killed"):
            main(args(folder, prompts, out))
        assert len(sampled) == 2 and torch.load(out / "work" / "drafter.pt")["step"] == 1
    with monkeypatch.context() as patch:  # resumed from step 2: two steps, no sampling
        sampled, steps = [], []
        fail_on_call(patch, "sample_training_tokens", 1, sampled)
        fail_on_call(patch, "model_drafter_loss", 99, steps)
        assert main(args(folder, prompts, out)) == 0
        assert sampled == [] and len(steps) == 2
    weights = load_file(out / "model.safetensors")
    assert set(weights) == set(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)
    with pytest.raises(ValueError, match="other settings"):  # the library refuses another run's checkpoints
        train_image_drafter(image_model_for(model, processor), PROMPTS, cfg_scale=1.5, seed=3, progress=False,
                            config=DrafterTrainConfig(steps=5, batch_size=4), checkpoint_dir=out / "work")


def test_another_job_in_the_folder_and_bad_input_are_refused_before_work(janus, tmp_path, capsys):
    folder, prompts = janus
    out = tmp_path / "drafter"
    assert main(args(folder, prompts, out)) == 0
    assert main(args(folder, prompts, out, "--seed", "4")) == 2
    assert 'seed: 3 -> 4' in capsys.readouterr().err
    assert main(args(folder, prompts, out, "--seed", "4", "--force")) == 0
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main(args(folder, empty, tmp_path / "other")) == 2
    assert "holds no prompt" in capsys.readouterr().err
    assert main(args(folder, prompts, tmp_path / "other", "--latent-size", "2x2")) == 2
    assert "--latent-size: JanusForConditionalGeneration generates images of one size" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()  # refused before the job took the folder
    assert main(args(tmp_path / "missing", prompts, tmp_path / "other")) == 2
    assert not (tmp_path / "other" / "model.safetensors").exists()


LLAMAGEN = Path("/work/shared/fixtures/llamagen")


def llamagen_args(out, *extra, config="gpt_c2i_config.json", classes="1,2"):
    return ["train-image-drafter", "--gpt-ckpt", str(LLAMAGEN / "gpt_c2i.pt"), "--vq-ckpt", str(LLAMAGEN / "vq.pt"),
            "--gpt-config", str(LLAMAGEN / config), "--vq-config", str(LLAMAGEN / "vq_config.json"), "--image-size",
            "8", "--classes", classes, "--images-per-prompt", "2", "--out", str(out), "--steps", "3", "--batch-size",
            "2", "--checkpoint-every", "2", "--sample-batch-size", "3", "--cfg-scale", "2", "--top-k", "16",
            "--seed", "5", "--device", "cpu", *extra]


@pytest.mark.skipif(not LLAMAGEN.is_dir(), reason="LlamaGen fixtures not available")
def test_llamagen_checkpoints_train_the_librarys_drafter_which_sample_images_then_uses(tmp_path, capsys):
    from specmm.image_ar import LlamaGen

    lg = LlamaGen.from_checkpoint(LLAMAGEN / "gpt_c2i.pt", LLAMAGEN / "vq.pt", str(LLAMAGEN / "gpt_c2i_config.json"),
                                  str(LLAMAGEN / "vq_config.json"), image_size=8)
    expected = train_image_drafter(lg, torch.tensor([1, 2]), cfg_scale=2.0, top_k=16, images_per_prompt=2, seed=5,
                                   progress=False, config=DrafterTrainConfig(steps=3, batch_size=2)).head.state_dict()
    out = tmp_path / "drafter"
    assert main(llamagen_args(out)) == 0
    weights = load_file(out / "model.safetensors")
    assert set(weights) == set(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)
    assert "sample-images --gpt-ckpt" in capsys.readouterr().out
    images = tmp_path / "images"
    assert main(["sample-images", *llamagen_args(images)[1:11], "--classes", "3", "--per-class", "1", "--method",
                 "lantern", "--drafter", str(out), "--top-k", "16", "--out", str(images), "--device", "cpu"]) == 0
    assert (images / "class0003_000.png").is_file()
    assert main(llamagen_args(out, "--seed", "6")) == 2  # another job in the folder
    assert "seed: 5 -> 6" in capsys.readouterr().err
    for changed, message in ((dict(classes="1,10"), "--classes: class ids must be in [0, 10)"),
                             (dict(config="gpt_t2i_config.json"), "--gpt-config: a t2i GPT")):
        assert main(llamagen_args(tmp_path / "other", **changed)) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "other").exists()  # before the job's folder
    mixed = [*llamagen_args(tmp_path / "other"), "--model", str(tmp_path)]
    assert main(mixed) == 2 and "--model: a stock generator folder takes --prompts, not" in capsys.readouterr().err
