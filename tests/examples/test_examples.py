"""Every script under examples/ runs here at the tiny scale (`--tiny`: random models built from configs), in-process
through its `main()`, and each shows its property: greedy speculation equals the model's own `generate`, SSD equals
stepwise decoding, captions equal decoded greedy `generate`, rollouts carry the target's own log-probs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import one_torch_thread
from tests.vlm.test_pipeline import reference_texts

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_every_example_is_tested_here():
    tested = {"text_sd", "eagle", "caption_folder", "multi_gpu_caption", "sample_images", "stree_mamba2",
              "ssd_llada", "reason_rollouts"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


@pytest.mark.parametrize("name", ["text_sd", "eagle", "stree_mamba2"])
def test_greedy_speculation_equals_generate(name):
    out = example(name)(["--tiny", "--max-new-tokens", "12"])
    assert torch.equal(out["sequences"], out["reference"])
    assert out["stats"].new_tokens == 12 * out["sequences"].shape[0]


def test_ssd_equals_stepwise_in_fewer_forwards():
    out = example("ssd_llada")(["--tiny", "--gen-length", "16"])
    assert torch.equal(out["ssd"].sequences, out["stepwise"].sequences)
    assert out["ssd"].stats.target_forwards < out["stepwise"].stats.target_forwards


def test_exact_image_sampling_at_temperature_zero_equals_greedy_ar(tmp_path):
    from specmm.image_ar import ImageSampler

    out = example("sample_images")(["--tiny", "--acceptance", "exact", "--temperature", "0", "--out", str(tmp_path)])
    greedy = ImageSampler(out["lg"], proposer="ar").sample(torch.tensor([1, 2, 3]), temperature=0.0, decode=False)
    assert torch.equal(out["tokens"], greedy.tokens)
    assert len(list(tmp_path.glob("*.png"))) == 3
    example("sample_images")(["--tiny", "--out", str(tmp_path / "gsd")])  # the GSD default runs too
    assert len(list((tmp_path / "gsd").glob("*.png"))) == 3


@pytest.mark.parametrize("name", ["caption_folder", "multi_gpu_caption"])
def test_captions_equal_decoded_greedy_generate(name, tmp_path):
    out_file = tmp_path / "caps.jsonl"
    out = example(name)(["--tiny", "--images", str(tmp_path / "imgs"), "--out", str(out_file),
                         "--max-new-tokens", "6"])
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    paths = sorted((tmp_path / "imgs").glob("*.png"))
    assert [r["image"] for r in records] == [str(p.resolve()) for p in paths]
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in paths]
    from specmm.vlm.caption import DEFAULT_PROMPT

    expected = reference_texts(out["target"], out["processor"], images, [DEFAULT_PROMPT] * len(images), 6)
    assert [r["caption"] for r in records] == expected


def test_rollouts_carry_the_target_log_probs_of_target_tokens():
    from specmm.reasoning.rollout import TARGET

    out = example("reason_rollouts")(["--tiny", "--max-new-tokens", "16"])
    trl, target = out["trl"], out["target"]
    assert [len(c) for c in trl["completion_ids"]] == [len(lp) for lp in trl["logprobs"]] == [
        len(s) for s in trl["source"]]
    prompt, completion = trl["prompt_ids"][0], trl["completion_ids"][0]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(target(ids).logits[0, len(prompt) - 1: -1].double(), dim=-1)
    own = logp[torch.arange(len(completion)), torch.tensor(completion)]
    rows = [i for i, s in enumerate(trl["source"][0]) if s == TARGET]
    assert rows, "the tiny judge regenerated no step: nothing to compare"
    assert torch.allclose(own[rows], torch.tensor(trl["logprobs"][0], dtype=torch.float64)[rows], atol=1e-4)
