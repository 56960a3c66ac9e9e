"""VisionDrafter: every method is lossless on LLaVA, LLaVA-NeXT and Qwen2.5-VL targets, upstream ViSpec and
EAGLE checkpoints load and reproduce their recorded outputs, and drafters that do not fit are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specmm
from specmm.core.eagle import EagleHead, head_config_for
from specmm.core.target import PrefillOutput
from specmm.vlm import METHODS, VisionDrafter
from specmm.vlm.drafter import IMAGE_ATTENTION, IMAGE_MASK
from tests.conftest import report_acceptance
from tests.vlm.test_targets import FAMILIES, MAX_NEW, PAD, setup, tiny_llava

FIXTURE = Path(__file__).parent / "fixtures" / "vispec"
SPECS = {"chain3": specmm.TreeSpec.chain(3), "dynamic": specmm.TreeSpec.dynamic(depth=3, top_k=3, total_tokens=10)}


def drafter_for(model, method: str, seed: int = 0) -> VisionDrafter:
    torch.manual_seed(seed)
    overrides = {"num_latents": 4, "sar_steps": 3} if method == "flash" else {}
    return VisionDrafter.for_target(model, method=method, **overrides)


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_equal_stock_generate_for_every_method(family, method, spec_name):
    model, inputs, eos, reference = setup(family)
    drafter = drafter_for(model, method)
    out = specmm.SpeculativeGenerator(model, drafter, tree=SPECS[spec_name]).generate(
        **inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"vlm/{family}/{method}/{spec_name}", out.stats)
    assert torch.equal(out.sequences, reference)
    assert drafter.image_tokens == int((inputs["input_ids"] == model.config.image_token_id).sum())
    if method == "vispec":  # one compressed token per image
        assert drafter.visual_tokens_seen == 3
    elif method == "dream":  # 75 % of the image tokens kept
        assert drafter.visual_tokens_seen < drafter.image_tokens


def test_vispec_fixture_reproduces_upstream_outputs():
    expected = load_file(FIXTURE / "expected.safetensors")
    weights = load_file(FIXTURE / "model.safetensors")
    target = tiny_fixture_target(weights["embed_tokens.weight"])
    drafter = VisionDrafter.from_pretrained(FIXTURE, target)
    assert drafter.method == "vispec" and drafter.head.config.num_q == 2
    ids = expected["input_ids"]
    mask = torch.ones_like(ids)
    prefill = PrefillOutput(expected["target_features"][:, :-1], expected["inputs_embeds"][:, :-1],
                            {IMAGE_MASK: expected["image_mask"][:, :-1]})
    with torch.no_grad():
        out, kept = drafter.teacher_forced(ids, mask, prefill)
        torch.testing.assert_close(out.last_hidden_state, expected["drafter_out"], atol=1e-4, rtol=0)
        assert kept[0].tolist() == [True] * 4 + [False] * 7 + [True] * 10  # one token at the image's last slot
        global_vector = drafter.prefill_inputs(ids, mask, prefill)[3]
        torch.testing.assert_close(global_vector, expected["global_image_vector"], atol=1e-4, rtol=0)
        plain = PrefillOutput(expected["target_features"][:, :-1], drafter.embed_tokens(ids[:, :-1]))
        no_image, _ = drafter.teacher_forced(ids, mask, plain)
        torch.testing.assert_close(no_image.last_hidden_state, expected["drafter_out_no_image"], atol=1e-4, rtol=0)


def tiny_fixture_target(embeddings: torch.Tensor):
    """A text target whose input embeddings are the fixture's (the drafter reads them, never copies them)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4)
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(embeddings)
    return target


def test_upstream_eagle_checkpoint_loads_strictly_except_frozen_embeddings(tmp_path):
    model = tiny_llava()
    head = EagleHead(head_config_for(model)).to(torch.float64)
    state = {**head.upstream_state_dict(), "embed_tokens.weight": model.get_input_embeddings().weight}
    torch.save({k: v.float() for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    config = head.config.to_dict()
    config.pop("specmm_method", None)
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))
    drafter = VisionDrafter.from_pretrained(tmp_path, model)
    assert drafter.method == "eagle"
    for key, value in head.upstream_state_dict().items():
        torch.testing.assert_close(drafter.head.upstream_state_dict()[key], value.to(drafter.head.fc.weight.dtype))
    del state["layers.0.mlp.up_proj.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="missing.*up_proj"):
        VisionDrafter.from_pretrained(tmp_path, model)


@pytest.mark.parametrize("method", METHODS)
def test_saved_drafter_reloads_to_identical_outputs(tmp_path, method):
    model, inputs, eos, _ = setup("llava")
    drafter = drafter_for(model, method, seed=3)
    with torch.no_grad():  # move every parameter off its initial value (gates, img_fc) so reloading is tested
        for p in drafter.head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    drafter.save_pretrained(tmp_path)
    reloaded = VisionDrafter.from_pretrained(tmp_path, model)
    gen = lambda d: specmm.SpeculativeGenerator(model, d, tree=SPECS["dynamic"]).generate(  # noqa: E731
        **inputs, max_new_tokens=8, pad_token_id=PAD)
    first, second = gen(drafter), gen(reloaded)
    assert torch.equal(first.sequences, second.sequences)
    assert first.stats.accepted_histogram == second.stats.accepted_histogram
    for key, value in drafter.head.upstream_state_dict().items():
        assert torch.equal(reloaded.head.upstream_state_dict()[key], value), key


def test_drafters_that_do_not_fit_the_target_are_refused(tmp_path):
    model = tiny_llava()
    with pytest.raises(ValueError, match="method"):
        VisionDrafter.for_target(model, method="medusa")
    with pytest.raises(ValueError, match="hidden_size 16 does not fit"):
        VisionDrafter.for_target(model, method="eagle", hidden_size=16, head_dim=8)
    saved = VisionDrafter.for_target(model, method="vispec")
    for field, value, message in (("hidden_size", 16, "hidden_size 16 does not fit"),
                                  ("vocab_size", 500, "vocabulary size 500 does not fit")):
        saved.save_pretrained(tmp_path / field)
        config = json.loads((tmp_path / field / "config.json").read_text())
        (tmp_path / field / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(ValueError, match=message):
            VisionDrafter.from_pretrained(tmp_path / field, model)
    flash = drafter_for(model, "flash")
    with pytest.raises(ValueError, match="depth 6"):
        specmm.SpeculativeGenerator(model, flash, tree=specmm.TreeSpec.chain(6))


@pytest.mark.parametrize("method", METHODS)
def test_every_draft_is_the_teacher_forced_prediction_training_sees(method):
    """Drafting feeds the head what the training pass feeds it: with chains of one, each round's draft is the
    argmax of `teacher_forced` (the pass `train_drafter` optimises) at that token's slot, over the same tokens.
    DREAM's image-token choice is given the prefill's attention scores (training scores the whole sequence)."""
    from specmm.vlm.train import run_target

    model, inputs, _, _ = setup("llava")
    drafter = drafter_for(model, method, seed=5)
    with torch.no_grad():  # off the initial values (gates, img_fc), so every module's input matters
        for p in drafter.head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    drafts, scores = [], []
    original_draft, original_start = drafter.draft, drafter.start
    drafter.draft = lambda *args: drafts.append(original_draft(*args)) or drafts[-1]
    drafter.start = lambda ids, mask, prefill: scores.append(prefill.extras.get(IMAGE_ATTENTION)) or \
        original_start(ids, mask, prefill)
    generator = specmm.SpeculativeGenerator(model, drafter, tree=specmm.TreeSpec.chain(1))
    checked = 0
    for row in range(inputs["input_ids"].shape[0]):
        keep = inputs["attention_mask"][row].bool()
        ids = inputs["input_ids"][row][keep][None]
        drafts.clear(), scores.clear()
        with torch.no_grad():
            out = generator.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     pixel_values=inputs["pixel_values"][row: row + 1], max_new_tokens=MAX_NEW,
                                     pad_token_id=PAD)
            sequence = out.sequences[:, : ids.shape[1] + out.stats.new_tokens_per_row[0]]
            batch = {"input_ids": sequence, "attention_mask": torch.ones_like(sequence),
                     "pixel_values": inputs["pixel_values"][row: row + 1]}
            passed = run_target(model, batch)
            extras = {IMAGE_MASK: passed.image_mask[:, :-1]}
            if scores[-1] is not None:  # [1, L-1] prompt slots; the new tokens' slots are text
                new_slots = scores[-1].new_zeros(1, sequence.shape[1] - ids.shape[1])
                extras[IMAGE_ATTENTION] = torch.cat([scores[-1], new_slots], 1)
            prefill = PrefillOutput(passed.features[:, :-1], passed.inputs_embeds[:, :-1], extras)
            hidden = drafter.teacher_forced(sequence, batch["attention_mask"], prefill)[0].last_hidden_state
            predicted = drafter.lm_head(hidden).argmax(-1)[0]  # slot t predicts token t + 2
        position = ids.shape[1]  # the first round drafts from the last prompt token
        for tree in drafts:
            if position >= sequence.shape[1]:
                break
            assert tree.tokens[0, 1] == predicted[position - 2], (row, position)
            position += 2 if tree.tokens[0, 1] == sequence[0, position] else 1
            checked += 1
    assert checked >= 3 * (MAX_NEW // 2)  # every round of every row was compared


@pytest.mark.parametrize("method", METHODS)
def test_a_batch_of_one_token_text_prompts_gives_stock_generate_tokens(method):
    """A prompt of one token has no (embedding, feature) pair yet: the drafter starts from a zero feature and, for
    ViSpec, a zero global vector (a fresh drafter has no earlier generation's vectors to read)."""
    model, _, _, _ = setup("llava")
    ids = torch.tensor([[5], [7]])
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, pad_token_id=PAD)
    out = specmm.SpeculativeGenerator(model, drafter_for(model, method), tree=SPECS["chain3"]).generate(ids, **kwargs)
    assert torch.equal(out.sequences, model.generate(input_ids=ids, do_sample=False, **kwargs))
