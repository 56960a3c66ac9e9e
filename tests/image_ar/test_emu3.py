"""Emu3 through ImageSampler is HF's own image generation: greedy tokens equal `generate` with the docs'
`prefix_allowed_tokens_fn` and guidance against a negative prompt, sampling is exact (chi-square over every image
of a tiny vocabulary), every token sits where the constraint allows it, and relaxed rules at zero knobs are exact.
"""

import itertools

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import (
    Emu3Config,
    Emu3ForConditionalGeneration,
    Emu3ImageProcessor,
    Emu3Processor,
    PreTrainedTokenizerFast,
)

from specmm.core.sampling import SamplingConfig, process_logits
from specmm.core.tree import TreeSpec
from specmm.image_ar import GSD, ImageDrafter, ImageSampler, Lantern
from specmm.image_ar.emu3 import Emu3ImageModel

from .test_sampler_distribution import assert_images_match

HEIGHT, WIDTH, SCALE = 2, 3, 3.0
MARKERS = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<image>", "<|extra_200|>", "<|extra_201|>",
           "<|image start|>", "<|image end|>", "<|image token|>"]


def tiny_emu3(codes: int, seed: int, dtype=torch.float64) -> Emu3ForConditionalGeneration:
    """A random Emu3 whose vocabulary holds the markers, digits, '*', a few letters and `codes` visual tokens (their
    ids in reverse code order, so the code <-> id mapping is exercised)."""
    names = MARKERS + list("0123456789*abcdefgh")
    vocab = {name: i for i, name in enumerate(names)}
    vocab |= {f"<|visual token {c:06d}|>": len(names) + codes - 1 - c for c in range(codes)}
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vq = dict(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, attn_resolutions=[], temporal_downsample_factor=1, hidden_size=32)
    torch.manual_seed(seed)
    return Emu3ForConditionalGeneration(
        Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab)).eval().to(dtype)


def tiny_processor(model) -> Emu3Processor:
    """An Emu3Processor built offline over the tiny vocabulary (one token per character), asking for 2x3 latents."""
    vocab = model.config.vocabulary_map
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens([name for name in vocab if name.startswith("<")])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        padding_side="left", extra_special_tokens={"image_token": "<image>", "boi_token": "<|image start|>",
                                                   "eoi_token": "<|image end|>", "eof_token": "<|extra_201|>",
                                                   "image_wrapper_token": "<|image token|>"})
    processor = Emu3Processor(image_processor=Emu3ImageProcessor(), tokenizer=tokenizer)
    processor.ratio, processor.image_area = f"{WIDTH}:{HEIGHT}", HEIGHT * WIDTH * 64
    return processor


def encode(model, texts: list[str], image: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts [B, L] (BOS, text, then <|image start|>H*W<|image token|> for image prompts)."""
    vocab = model.config.vocabulary_map
    tail = ["<|image start|>", *f"{HEIGHT}*{WIDTH}", "<|image token|>"] if image else []
    rows = [[vocab[t] for t in ["<|extra_203|>", *text, *tail]] for text in texts]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    return ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])


def allowed_fn(model, height: int = HEIGHT, width: int = WIDTH):
    """The HF docs' `prefix_allowed_tokens_fn` for Emu3 image generation."""
    vocab = model.config.vocabulary_map
    visual = model.vocabulary_mapping.image_tokens

    def allowed(batch_id, input_ids):
        position = torch.nonzero(input_ids == vocab["<|image token|>"], as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        end = (width + 1) * height
        if offset % (width + 1) == 0:
            return (vocab["<|extra_200|>"],)
        if offset == end + 1:
            return (vocab["<|extra_201|>"],)
        if offset == end + 2:
            return (vocab["<|image end|>"],)
        if offset == end + 3:
            return (2,)
        if offset > end + 3:
            return (0,)
        return visual

    return allowed


def assert_constraint_holds(model, prompt: torch.Tensor, sequences: torch.Tensor) -> None:
    """Every generated token is one the docs' function allows after its own prefix."""
    allowed = allowed_fn(model)
    for row in sequences.tolist():
        for k, token in enumerate(row):
            assert token in allowed(0, torch.tensor(prompt.tolist() + row[:k]))


# ---------------------------------------------------------------------------------------------- greedy
@pytest.fixture(scope="module")
def greedy_setup():
    model = tiny_emu3(codes=6, seed=3)
    prompt, mask = encode(model, ["abc", "defgha"])
    negative = encode(model, ["hh", "gfedc"], image=False)
    n = (WIDTH + 1) * HEIGHT + 3

    def generate(**guidance):
        out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=n, do_sample=False,
                             prefix_allowed_tokens_fn=allowed_fn(model), **guidance)
        return out[:, prompt.shape[1]:]

    reference = generate(negative_prompt_ids=negative[0], negative_prompt_attention_mask=negative[1],
                         guidance_scale=SCALE)
    # the test can see the negative prompt, its padding and guidance: each changes HF's tokens here
    for other in (generate(negative_prompt_ids=negative[0], guidance_scale=SCALE), generate(guidance_scale=SCALE),
                  generate()):
        assert not torch.equal(other, reference)
    image_model = Emu3ImageModel(model, height=HEIGHT, width=WIDTH,
                                 negative_prompt={"input_ids": negative[0], "attention_mask": negative[1]})
    return image_model, prompt, mask, reference


@pytest.mark.parametrize("proposer", ["ar", "jacobi-4", "jacobi-7", "drafter-chain", "drafter-tree"])
def test_greedy_tokens_equal_generate_with_negative_prompt(greedy_setup, proposer):
    image_model, prompt, mask, reference = greedy_setup
    tree = {"drafter-chain": TreeSpec.chain(3), "drafter-tree": TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6)}
    if proposer.startswith("drafter"):
        torch.manual_seed(0)
        sampler = ImageSampler(image_model, proposer=ImageDrafter.for_target(image_model.lm), tree=tree[proposer])
    else:
        sampler = ImageSampler(image_model, proposer=proposer.split("-")[0],
                               window=int(proposer.split("-")[1]) if "-" in proposer else 16)
    out = sampler.sample(prompt, cfg_scale=SCALE, temperature=0.0, caption_mask=mask, decode=proposer == "ar")
    assert torch.equal(image_model.target.sequences(out.tokens), reference)
    assert out.tokens.shape == (2, HEIGHT * WIDTH) and out.stats.new_tokens == 2 * HEIGHT * WIDTH
    if proposer == "ar":  # decoded by the model's own Emu3VQVAE: 2x3 latents at spatial factor 2
        assert [image.size for image in out.images] == [(2 * WIDTH, 2 * HEIGHT)] * 2


def test_compiled_greedy_tokens_equal_generate_under_cuda_graph_rules(greedy_setup, monkeypatch):
    """`compile=True` over a static cache sized for the prompt, the image and its ends of line: Jacobi, then a drafter
    chain whose verify has the Jacobi window's shape (the drafter's feature-capture hook needs graphs of its own),
    under CUDA graphs' rules (`tests.graph_pool`); the Janus test covers a compiled drafter tree."""
    from tests.graph_pool import graphed_on_cpu

    image_model, prompt, mask, reference = greedy_setup
    pool = graphed_on_cpu(monkeypatch)
    torch.manual_seed(0)
    drafter = ImageDrafter.for_target(image_model.lm)
    samplers = [ImageSampler(image_model, proposer="jacobi", window=4, compile=True),
                ImageSampler(image_model, proposer=drafter, tree=TreeSpec.chain(3), compile=True)]
    for sampler in samplers:
        out = sampler.sample(prompt, cfg_scale=SCALE, temperature=0.0, caption_mask=mask, decode=False)
        assert torch.equal(image_model.target.sequences(out.tokens), reference)
        assert sampler.whole_round
    assert pool.calls > 0 and pool.skipped == pool.rerecorded == pool.hosted == []


# ---------------------------------------------------------------------------------------------- sampling
SAMPLES, SAMPLING = 2000, SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def sampling_setup():
    """Two visual codes on a 2x3 grid: 64 images, each with its exact probability under HF's processing, computed
    by teacher forcing the stock model (cond with left-padding positions, uncond over its own positions) and the
    docs' constraint function."""
    model = tiny_emu3(codes=2, seed=3, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # sharper random distributions
    prompt, _ = encode(model, ["abc"])
    negative, _ = encode(model, ["hg"], image=False)
    image_model = Emu3ImageModel(model, height=HEIGHT, width=WIDTH, negative_prompt=negative)
    codes = torch.tensor(list(itertools.product(range(2), repeat=HEIGHT * WIDTH)))  # [64, 6]
    sequences = image_model.target.sequences(codes)  # [64, 11] model ids with the forced tokens
    n = sequences.shape[0]
    with torch.no_grad():
        cond = model(input_ids=torch.cat([prompt.expand(n, -1), sequences], 1)).logits[:, prompt.shape[1] - 1:-1]
        uncond = model(input_ids=torch.cat([negative.expand(n, -1), sequences], 1)).logits[:, negative.shape[1] - 1:-1]
    scores = SCALE * (cond.float().log_softmax(-1) - uncond.log_softmax(-1)) + uncond.log_softmax(-1)
    allowed = allowed_fn(model)
    mask = torch.full_like(scores, -torch.inf)
    for i, row in enumerate(sequences.tolist()):
        for k in range(len(row)):
            mask[i, k, list(allowed(0, torch.tensor(prompt[0].tolist() + row[:k])))] = 0
    probs = process_logits(scores + mask, SAMPLING).gather(-1, sequences[:, :, None])[:, :, 0].prod(-1).double()
    assert abs(float(probs.sum()) - 1.0) < 1e-4
    return image_model, prompt, codes, probs


def check_samples(setup, sampler) -> None:
    image_model, prompt, codes, probs = setup
    out = sampler.sample(prompt.expand(SAMPLES, -1), cfg_scale=SCALE, temperature=1.0,
                         generator=torch.Generator().manual_seed(0), decode=False)
    assert_images_match(out.tokens, codes.tolist(), probs)
    assert out.stats.step_compression > 1.0  # drafts were really accepted
    distinct = torch.unique(out.tokens, dim=0)  # the constraint at every accepted token, on each distinct image
    assert_constraint_holds(image_model.emu3, prompt[0], image_model.target.sequences(distinct))


def test_sjd_jacobi_samples_generate_distribution(sampling_setup):
    check_samples(sampling_setup, ImageSampler(sampling_setup[0], proposer="jacobi", acceptance="sjd", window=4))


def test_exact_drafter_samples_generate_distribution(sampling_setup):
    torch.manual_seed(1)
    drafter = ImageDrafter.for_target(sampling_setup[0].lm)
    check_samples(sampling_setup, ImageSampler(sampling_setup[0], proposer=drafter, tree=TreeSpec.chain(2)))


@pytest.mark.parametrize("relaxed", [Lantern(k=1, delta=0.0), GSD(window=1)], ids=["lantern-delta0", "gsd-singleton"])
@pytest.mark.parametrize("proposer", ["jacobi", "drafter"])
def test_relaxed_rules_at_zero_knobs_equal_exact(greedy_setup, relaxed, proposer):
    image_model, prompt, mask, _ = greedy_setup

    def run(rule):
        torch.manual_seed(0)
        p = ImageDrafter.for_target(image_model.lm) if proposer == "drafter" else "jacobi"
        sampler = ImageSampler(image_model, proposer=p, acceptance=rule, window=4,
                               tree=(TreeSpec.dynamic(depth=2, top_k=2, total_tokens=5)
                                     if proposer == "drafter" else None))
        gens = [torch.Generator().manual_seed(10 + i) for i in range(2)]
        return sampler.sample(prompt, cfg_scale=SCALE, temperature=1.0, caption_mask=mask, generator=gens,
                              decode=False)

    exact, relaxed_out = run("exact"), run(relaxed)
    assert torch.equal(exact.tokens, relaxed_out.tokens)
    assert relaxed_out.stats.moved_mass == 0.0


def test_relaxed_rules_keep_the_constraint(greedy_setup):
    """LANTERN and GSD with real knobs move mass between codes only: every token still sits where it may."""
    image_model, prompt, mask, _ = greedy_setup
    for rule in (Lantern(k=3, delta=0.5), GSD(window=4, p_gap=0.5, d_max=4.0)):
        out = ImageSampler(image_model, proposer="jacobi", acceptance=rule, window=4).sample(
            prompt, cfg_scale=SCALE, temperature=1.0, caption_mask=mask, generator=torch.Generator().manual_seed(0),
            decode=False)
        for row, row_mask in zip(prompt, mask):
            assert_constraint_holds(image_model.emu3, row[row_mask.bool()], image_model.target.sequences(out.tokens))


# ---------------------------------------------------------------------------------------------- public API
def test_for_model_with_processor_equals_generate_from_processor_inputs(greedy_setup):
    model = greedy_setup[0].emu3
    processor = tiny_processor(model)
    texts = ["abc", "defgh"]
    # the size asked in the call too: transformers before 5.24 reads it there, not from the processor's attributes
    inputs = processor(text=texts, padding=True, return_tensors="pt", return_for_image_generation=True,
                       ratio=processor.ratio, image_area=processor.image_area)
    assert inputs.pop("image_sizes") == [[HEIGHT, WIDTH]] * 2
    reference = model.generate(**inputs, max_new_tokens=(WIDTH + 1) * HEIGHT + 3, do_sample=False,
                               prefix_allowed_tokens_fn=allowed_fn(model), guidance_scale=SCALE)
    sampler = ImageSampler.for_model(model, processor, proposer="jacobi", window=4)
    out = sampler.sample(texts, cfg_scale=SCALE, temperature=0.0)
    assert torch.equal(sampler.model.target.sequences(out.tokens), reference[:, inputs["input_ids"].shape[1]:])
    assert [image.size for image in out.images] == [(2 * WIDTH, 2 * HEIGHT)] * 2


def test_hf_generate_is_the_docs_call_and_codes_invert_sequences(greedy_setup):
    """The adapter's `hf_generate` (what benchmarks time as HF's row) returns HF's tokens as codes; its constraint
    function allows what the docs' does after every prefix; `codes` inverts `sequences`."""
    image_model, prompt, mask, reference = greedy_setup
    target = image_model.target
    codes = image_model.hf_generate({"input_ids": prompt, "attention_mask": mask}, SCALE, do_sample=False)
    assert codes.shape == (2, HEIGHT * WIDTH) and torch.equal(target.sequences(codes), reference)
    assert torch.equal(target.codes(reference), codes)
    docs, ours = allowed_fn(image_model.emu3), target.allowed_tokens()
    for row in torch.cat([prompt, reference, torch.zeros_like(reference[:, :2])], 1):  # past EOS: padding
        for end in range(prompt.shape[1], row.shape[0] + 1):
            assert sorted(ours(0, row[:end])) == sorted(docs(0, row[:end]))
    with pytest.raises(ValueError, match="no visual code"):
        target.codes(torch.zeros_like(reference))


def test_bad_emu3_inputs_raise_before_work(greedy_setup):
    image_model, prompt, mask, _ = greedy_setup
    sampler = ImageSampler(image_model, proposer="jacobi", window=4)
    with pytest.raises(ValueError, match="asks for a 3x3 image"):
        wrong = prompt.clone()
        wrong[1, -4] = image_model.emu3.config.vocabulary_map["3"]  # <|image start|>3*3<|image token|>
        sampler.sample(wrong, cfg_scale=SCALE, temperature=0.0, caption_mask=mask)
    with pytest.raises(ValueError, match=r"must end with the one <\|image token\|>"):
        sampler.sample(prompt[:, :-1], cfg_scale=SCALE, temperature=0.0)
    with pytest.raises(ValueError, match="text prompts need the model's Emu3Processor"):
        sampler.sample(["abc"], cfg_scale=SCALE)
    with pytest.raises(ValueError, match=r"conditions: expected token ids \[prompts, length\] \(a 2-D tensor\)"):
        sampler.sample(prompt[0], cfg_scale=SCALE)
    with pytest.raises(ValueError, match=r"negative_prompt: expected token ids .*got \[2, 3, 1\]"):
        sampler.sample(prompt, cfg_scale=SCALE, negative_prompt=prompt[:, :3, None])
    with pytest.raises(ValueError, match="cfg_interval: Emu3 guides every token"):
        ImageSampler(image_model, proposer="jacobi", window=4, cfg_interval=2).sample(prompt, cfg_scale=SCALE)
    with pytest.raises(ValueError, match="Emu3ForConditionalGeneration"):
        Emu3ImageModel(torch.nn.Linear(2, 2), height=HEIGHT, width=WIDTH)
    with pytest.raises(ValueError, match="steps: not a sampling option of Emu3"):
        sampler.sample(prompt, cfg_scale=SCALE, caption_mask=mask, steps=3)
    with pytest.raises(ValueError, match="negative_prompt: 3 negative prompts for 2 prompts"):
        sampler.sample(prompt, cfg_scale=SCALE, caption_mask=mask, negative_prompt=torch.ones(3, 2, dtype=torch.long))


def test_cli_samples_a_saved_emu3_folder(greedy_setup, tmp_path):
    """`specmm sample-images --model DIR --latent-size 2x3` on a saved tiny Emu3 and its processor writes the greedy
    images of `ImageSampler.for_model`. A saved Emu3Processor keeps no generation size (its ratio and image area
    are class defaults, 90x90 latents): the size comes from the flag."""
    import numpy as np
    from PIL import Image

    from specmm.cli import main

    model = greedy_setup[0].emu3
    processor = tiny_processor(model)
    folder, out, prompts = tmp_path / "emu3", tmp_path / "images", tmp_path / "prompts.txt"
    model.to(torch.float32).save_pretrained(folder)
    model.to(torch.float64)
    processor.save_pretrained(folder)
    prompts.write_text("abc\ndefgh\n")
    assert main(["sample-images", "--model", str(folder), "--prompts", str(prompts), "--method", "sjd",
                 "--latent-size", f"{HEIGHT}x{WIDTH}", "--per-class", "1", "--cfg-scale", str(SCALE),
                 "--temperature", "0", "--out", str(out)]) == 0
    assert (out / "grid.png").is_file()
    expected = ImageSampler.for_model(model.to(torch.float32), processor, window=4).sample(
        ["abc", "defgh"], cfg_scale=SCALE, temperature=0.0).images
    for i, image in enumerate(expected):
        assert np.array_equal(np.asarray(Image.open(out / f"prompt{i:04d}_000.png")), np.asarray(image))
    # --negative-prompt: the images of a sampler given it, whose tokens are HF generate's with it
    assert main(["sample-images", "--model", str(folder), "--prompts", str(prompts), "--method", "sjd",
                 "--latent-size", f"{HEIGHT}x{WIDTH}", "--negative-prompt", "hh", "--per-class", "1",
                 "--cfg-scale", str(SCALE), "--temperature", "0", "--out", str(tmp_path / "negative")]) == 0
    sampler = ImageSampler.for_model(model, processor, window=4)
    guided = sampler.sample(["abc", "defgh"], cfg_scale=SCALE, temperature=0.0, negative_prompt="hh")
    assert torch.equal(guided.tokens, sampler.model.hf_generate(["abc", "defgh"], SCALE, negative_prompt="hh",
                                                                do_sample=False))
    for i, image in enumerate(guided.images):
        assert np.array_equal(np.asarray(Image.open(tmp_path / "negative" / f"prompt{i:04d}_000.png")),
                              np.asarray(image))
    assert not torch.equal(guided.tokens, sampler.sample(["abc", "defgh"], cfg_scale=SCALE, temperature=0.0,
                                                          decode=False).tokens)  # it took effect
    model.to(torch.float64)
