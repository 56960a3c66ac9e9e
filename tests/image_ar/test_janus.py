"""Janus-Pro through `ImageSampler.for_model`: the stock model's own image `generate` is the reference.

Greedy tokens equal HF's `generate(generation_mode="image", do_sample=False)` on a ragged batch, for Jacobi and a
drafter; sampled images follow the distribution HF's own processors (guidance, temperature, top-k) define on the
stock model teacher-forced (chi-square, 2x2 tokens over 4 codes); LANTERN at delta 0 and GSD with singleton groups
give exact's tokens.
"""

import itertools

import pytest
import torch
from transformers.generation.logits_process import (
    ClassifierFreeGuidanceLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from specmm.core.tree import TreeSpec
from specmm.image_ar import GSD, ImageDrafter, ImageSampler, Lantern
from specmm.image_ar.janus import JanusImageModel, stock_generate_problem

from .stock import janus_processor, tiny_janus
from .test_sampler_distribution import assert_images_match

PROMPTS = ["a red cat on the mat under the big tree", "blue sky"]  # different lengths: left padding
SCALE = 3.0


@pytest.fixture(scope="module")
def janus():
    return tiny_janus(), janus_processor()


@pytest.fixture(scope="module")
def hf_greedy(janus):
    if stock_generate_problem():
        pytest.skip(stock_generate_problem())
    model, processor = janus
    inputs = processor(text=PROMPTS, generation_mode="image", padding=True, return_tensors="pt")
    assert not bool(inputs["attention_mask"].all())  # really ragged
    return model.generate(**inputs, generation_mode="image", do_sample=False, guidance_scale=SCALE)


@pytest.mark.parametrize("proposer", ["ar", "jacobi", "drafter"])
def test_greedy_tokens_equal_hf_generate(janus, hf_greedy, proposer):
    model, processor = janus
    chosen = ImageDrafter.for_target(model) if proposer == "drafter" else proposer
    tree = TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6) if proposer == "drafter" else None
    sampler = ImageSampler.for_model(model, processor, proposer=chosen, window=4, tree=tree)
    out = sampler.sample(PROMPTS, cfg_scale=SCALE, temperature=0.0)
    assert torch.equal(out.tokens, hf_greedy)
    assert len(out.images) == 2 and out.images[0].size == (8, 8)
    if proposer == "jacobi":
        assert out.stats.step_compression > 1.0


SAMPLES, TEMPERATURE, TOP_K, CODES = 2000, 1.5, 3, 4


@pytest.fixture(scope="module")
def small():
    return tiny_janus(codes=CODES, grid=2, seed=1, dtype=torch.float32), janus_processor(tokens_per_image=4)


def hf_probabilities(model, processor) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The probability of each of the 256 images: the stock model teacher-forced over the doubled batch (HF's
    uncond rows: BOS and BOI kept, the rest pad), scored by HF's own CFG / temperature / top-k processors."""
    sequences = list(itertools.product(range(CODES), repeat=4))
    tokens = torch.tensor(sequences)
    n = len(sequences)
    ids = processor(text=PROMPTS[:1], generation_mode="image", return_tensors="pt")["input_ids"]
    g = model.generation_config
    keep = (ids == g.bos_token_id) | (ids == g.generation_kwargs["boi_token_id"])
    rows = torch.cat([ids, ids.masked_fill(~keep, g.pad_token_id)]).repeat_interleave(n, 0)  # [2n, L]
    with torch.no_grad():
        embeds = torch.cat([model.get_input_embeddings()(rows),
                            model.prepare_embeddings_for_image_generation(tokens[:, :-1].repeat(2, 1))], 1)
        hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, ids.shape[1] - 1:]
        scores = model.model.generation_head(hidden)  # [2n, 4, V]
    processors = [ClassifierFreeGuidanceLogitsProcessor(SCALE), TemperatureLogitsWarper(TEMPERATURE),
                  TopKLogitsWarper(TOP_K)]
    probs = []
    for i in range(4):
        step = scores[:, i]
        for p in processors:
            step = p(ids.repeat(n, 1), step)
        probs.append(step.softmax(-1))
    probs = torch.stack(probs, 1)  # [n, 4, V]
    return sequences, probs.gather(-1, tokens[:, :, None])[:, :, 0].prod(-1).double()


def check_distribution(sampler, expected, sequences) -> None:
    out = sampler.sample(PROMPTS[:1] * SAMPLES, cfg_scale=SCALE, temperature=TEMPERATURE, top_k=TOP_K,
                         generator=torch.Generator().manual_seed(0), decode=False)
    assert_images_match(out.tokens, sequences, expected)
    assert out.stats.step_compression > 1.0  # drafts were really accepted


@pytest.fixture(scope="module")
def expected(small):
    return hf_probabilities(*small)


def test_sjd_samples_the_hf_distribution(small, expected):
    sequences, probs = expected
    check_distribution(ImageSampler.for_model(*small, proposer="jacobi", acceptance="sjd", window=4), probs, sequences)


def test_exact_sd_samples_the_hf_distribution(small, expected):
    sequences, probs = expected
    torch.manual_seed(1)
    drafter = ImageDrafter.for_target(small[0])
    sampler = ImageSampler.for_model(*small, proposer=drafter, acceptance="exact", tree=TreeSpec.chain(2))
    check_distribution(sampler, probs, sequences)


@pytest.mark.parametrize(("relaxed", "proposer"), [(Lantern(k=5, delta=0.0), "drafter"), (GSD(window=1), "jacobi")],
                         ids=["lantern-delta0-drafter", "gsd-singleton-jacobi"])
def test_relaxed_rules_at_zero_knobs_equal_exact(janus, relaxed, proposer):
    model, processor = janus

    def run(rule):
        torch.manual_seed(2)
        chosen = ImageDrafter.for_target(model) if proposer == "drafter" else "jacobi"
        sampler = ImageSampler.for_model(model, processor, proposer=chosen, acceptance=rule, window=4,
                                         tree=TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6) if chosen != "jacobi"
                                         else None)
        gens = [torch.Generator().manual_seed(10 + i) for i in range(2)]
        return sampler.sample(PROMPTS, cfg_scale=2.0, temperature=1.0, top_k=16, generator=gens, decode=False)

    exact, relaxed_out = run("exact"), run(relaxed)
    assert torch.equal(exact.tokens, relaxed_out.tokens)
    assert relaxed_out.stats.moved_mass == 0.0


def test_bad_input_is_refused_before_any_work(janus):
    model, processor = janus
    sampler = ImageSampler.for_model(model, processor, proposer="ar")
    with pytest.raises(ValueError, match="processor: text prompts need"):
        ImageSampler.for_model(model, None, proposer="ar").sample(PROMPTS)
    with pytest.raises(ValueError, match="cfg_scale: guidance scale must be >= 1"):
        sampler.sample(PROMPTS, cfg_scale=0.5)
    inputs = processor(text=PROMPTS, generation_mode="image", padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="conditions: expected integer token ids, got torch.float32"):
        sampler.sample({**inputs, "input_ids": inputs["input_ids"].float()})
    with pytest.raises(ValueError, match="conditions: its attention mask must be a tensor of its shape"):
        sampler.sample({**inputs, "attention_mask": inputs["attention_mask"].tolist()})
    with pytest.raises(ValueError, match="cfg_interval"):
        ImageSampler.for_model(model, processor, proposer="ar", cfg_interval=3).sample(PROMPTS)
    with pytest.raises(ValueError, match="compile: JanusImageModel has no compiled fast path"):
        plain = JanusImageModel(model, processor)
        plain.compiles = False  # an image model without one
        ImageSampler(plain, compile=True)
    model.generation_config.repetition_penalty = 1.3
    try:
        with pytest.raises(ValueError, match=r"generation_config.repetition_penalty=1.3: a logits processor"):
            ImageSampler.for_model(model, processor)
    finally:
        model.generation_config.repetition_penalty = 1.0


def test_cli_samples_a_janus_folder_with_resume_and_grid(janus, tmp_path, capsys):
    import json

    from specmm.cli import main

    model, processor = janus
    folder, out = tmp_path / "janus", tmp_path / "images"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    args = ["sample-images", "--model", str(folder), "--prompts", str(prompts), "--method", "sjd", "--per-class", "1",
            "--cfg-scale", str(SCALE), "--temperature", "0", "--out", str(out)]
    assert main(args) == 0
    names = sorted(p.name for p in out.glob("prompt*.png"))
    assert names == ["prompt0000_000.png", "prompt0001_000.png"] and (out / "grid.png").is_file()
    assert json.loads((out / "summary.json").read_text())["sampled_now"] == 2
    first = (out / names[1]).read_bytes()
    (out / names[1]).unlink()
    assert main([*args, "--resume"]) == 0
    assert (out / names[1]).read_bytes() == first  # the resumed image is the uninterrupted run's
    assert json.loads((out / "summary.json").read_text())["sampled_now"] == 1
    capsys.readouterr()
    assert main([*args[:-2], "--classes", "1", "--out", str(tmp_path / "x")]) == 2
    assert "--model: a stock generator folder takes --prompts, not --classes" in capsys.readouterr().err
    assert main([*args[:-2], "--negative-prompt", "blurry", "--out", str(tmp_path / "x")]) == 2
    assert "--negative-prompt: JanusForConditionalGeneration takes no negative prompt" in capsys.readouterr().err
    assert main([*args[:-2], "--latent-size", "2x2", "--out", str(tmp_path / "x")]) == 2
    assert "--latent-size: JanusForConditionalGeneration generates images of one size" in capsys.readouterr().err
    assert not list((tmp_path / "x").glob("*.png"))


def test_compiled_greedy_tokens_equal_hf_generate_under_cuda_graph_rules(janus, hf_greedy, monkeypatch):
    """`compile=True`: the stock language model's forwards run compiled over a static cache sized for the text prompt,
    AR, Jacobi and a drafter tree in turn on one model (as a benchmark's rows), under CUDA graphs' rules
    (`tests.graph_pool`: outputs overwritten at the next step, nothing recorded again)."""
    from tests.graph_pool import graphed_on_cpu

    model, processor = janus
    pool = graphed_on_cpu(monkeypatch)
    for proposer in ("ar", "jacobi", "drafter"):
        torch.manual_seed(0)
        chosen = ImageDrafter.for_target(model) if proposer == "drafter" else proposer
        tree = TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6) if proposer == "drafter" else None
        sampler = ImageSampler.for_model(model, processor, proposer=chosen, window=4, tree=tree, compile=True)
        out = sampler.sample(PROMPTS, cfg_scale=SCALE, temperature=0.0, decode=False)
        assert torch.equal(out.tokens, hf_greedy), proposer
        assert sampler.whole_round is (None if proposer == "ar" else True)  # rounds after the first: one graph
    assert pool.calls > 0 and pool.skipped == pool.rerecorded == pool.hosted == []


@pytest.mark.parametrize("proposer", ["jacobi", "drafter"])
def test_compiled_sampling_draws_eager_modes_tokens(janus, proposer, capture_only):
    """Sampled with the same seeds, compiled mode gives eager mode's tokens (its draws are made eagerly, in eager
    mode's order, `specmm.core.compiled.taped_rounds`), so it samples the law the eager tests check."""
    model, processor = janus
    tokens = []
    for compile in (False, True):
        torch.manual_seed(0)
        chosen = ImageDrafter.for_target(model) if proposer == "drafter" else proposer
        tree = TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6) if proposer == "drafter" else None
        sampler = ImageSampler.for_model(model, processor, proposer=chosen, window=4, tree=tree, compile=compile)
        generators = [torch.Generator().manual_seed(seed) for seed in (1, 2)]
        tokens.append(sampler.sample(PROMPTS, cfg_scale=SCALE, temperature=1.0, top_k=3, generator=generators,
                                     decode=False).tokens)
    assert torch.equal(tokens[0], tokens[1])
