"""Position schemes of stock checkpoints: absolute tables up to their last row, switching RoPE, ALiBi refused;
recurrent and conv-state models refused by the key/value-cache adapters."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    FalconConfig,
    FalconForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoConfig,
    GPTNeoForCausalLM,
    MptConfig,
    MptForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    RecurrentGemmaConfig,
    RecurrentGemmaForCausalLM,
    RwkvConfig,
    RwkvForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    TrOCRConfig,
    TrOCRForCausalLM,
    xLSTMConfig,
    xLSTMForCausalLM,
)

import specmm
from specmm.core.limits import position_limit, recurrent_state
from specmm.drafters import ModelDrafter, PromptLookupDrafter
from tests.conftest import VOCAB, left_padded_batch, perturbed_copy, tiny_model

PAD = 0
POSITIONS = 32
PROMPT_LENGTHS = [5, 11, 3, 8]  # the longest row (11) reaches the last position with 22 new tokens


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=4, bos_token_id=None,
                        eos_token_id=None, pad_token_id=PAD)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).double().eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, PAD
    return model


def counting(model) -> list:
    forwards = []
    model.register_forward_pre_hook(lambda *args: forwards.append(1))
    return forwards


@pytest.mark.parametrize("tree", [specmm.TreeSpec.chain(4), specmm.TreeSpec.dynamic(depth=5, top_k=3, total_tokens=16)],
                         ids=["chain4", "dynamic"])
def test_gpt2_decoded_to_its_last_position_equals_generate(tree):
    target = tiny_gpt2()
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    new = POSITIONS + 1 - max(PROMPT_LENGTHS)  # the last new token sits at position 32 and is never run
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=tree)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=new)
    assert torch.equal(out.sequences, reference)
    assert sum(out.stats.accepted_histogram[1:]) > 0


def test_gpt2_past_its_last_position_is_refused_before_any_forward():
    target = tiny_gpt2()
    forwards = counting(target)
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    gen = specmm.SpeculativeGenerator(target, PromptLookupDrafter())
    with pytest.raises(ValueError, match=r"max_new_tokens: GPT2LMHeadModel has absolute position embeddings for 32 "
                                         r"positions.*max_new_tokens <= 22"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=23)
    assert forwards == []


def test_position_limit_reads_the_table_and_its_offset():
    opt = OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, ffn_dim=32,
                                   num_attention_heads=2, max_position_embeddings=40, word_embed_proj_dim=32))
    assert position_limit(opt) == 40  # OPT's table has 42 rows, shifted by 2
    assert position_limit(tiny_gpt2()) == POSITIONS
    assert position_limit(tiny_model("llama")) is None


def longrope_phi3():
    half = 4  # head_dim 8 / 2
    return tiny_model("phi3", max_position_embeddings=64, original_max_position_embeddings=16,
                      rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 1.0][:half],
                                    "long_factor": [4.0, 8.0, 16.0, 32.0][:half]},
                      head_dim=8)


@pytest.mark.parametrize("build, kind", [
    (longrope_phi3, "longrope"),
    (lambda: tiny_model("llama", max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
     "dynamic"),
])
def test_switching_rope_is_exact_below_the_switch_and_refused_across_it(build, kind):
    target = build()
    ids, mask = left_padded_batch([5, 9, 3], seed=2)
    new = 17 - 9  # positions 0..15: every forward stays below the switch, in HF and in specmm
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)),
                                      tree=specmm.TreeSpec.dynamic(depth=4, top_k=3, total_tokens=12))
    assert torch.equal(gen.generate(ids, attention_mask=mask, max_new_tokens=new).sequences, reference)
    forwards = counting(target)
    with pytest.raises(ValueError, match=f"max_new_tokens: .* uses '{kind}' RoPE.*max_new_tokens <= {new}"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=new + 1)
    assert forwards == []


def test_a_target_drafting_for_itself_up_to_its_dynamic_rope_switch_equals_generate():
    """The drafter runs the target's own rotary module: its nodes past the switch (beyond every row's budget) would
    switch the frequencies, which HF keeps for a forward reaching exactly the switch, the target's last verify."""
    target = tiny_model("llama", max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 16.0})
    with torch.no_grad():  # sharp attention: a wrong rotation shows in the argmax
        for layer in target.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    ids, mask = left_padded_batch([5, 9, 3], seed=4)
    new = 17 - 9  # the longest row's forwards reach position 15: exactly the switch
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=specmm.TreeSpec.chain(6))
    assert torch.equal(gen.generate(ids, attention_mask=mask, max_new_tokens=new).sequences, reference)
    assert target.model.rotary_emb.max_seq_len_cached == 16  # the frequencies never switched


def test_gpt_neo_local_attention_layers_are_refused_and_global_ones_decode_exactly():
    """GPT-Neo windows its local layers by cache index inside the model: a dynamic tree over a ragged batch gave
    other tokens than generate before the refusal; with global layers only, its tokens equal generate's."""
    def gpt_neo(kinds):
        torch.manual_seed(0)
        config = GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, window_size=6,
                              attention_types=[[kinds, 1]], max_position_embeddings=128, pad_token_id=PAD)
        model = GPTNeoForCausalLM(config).double().eval()
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, PAD
        return model

    with pytest.raises(ValueError, match="target: GPTNeoForCausalLM has local attention layers"):
        specmm.SpeculativeGenerator(gpt_neo(["global", "local"]), PromptLookupDrafter())
    with pytest.raises(ValueError, match="drafter: GPTNeoForCausalLM has local attention layers"):
        ModelDrafter(gpt_neo(["local", "global"]))
    target = gpt_neo(["global", "global"])
    ids, mask = left_padded_batch([3, 8, 5], seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)),
                                      tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8))
    assert torch.equal(gen.generate(ids, attention_mask=mask, max_new_tokens=16).sequences, reference)


ALIBI_MODELS = {
    "bloom": lambda: BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4)),
    "falcon-alibi": lambda: FalconForCausalLM(FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                           num_attention_heads=4, alibi=True)),
    "mpt": lambda: MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=4)),
}


@pytest.mark.parametrize("name", list(ALIBI_MODELS))
def test_alibi_models_are_refused_as_target_and_drafter(name):
    model = ALIBI_MODELS[name]().eval()
    model.config._attn_implementation = "sdpa"
    cls = type(model).__name__
    with pytest.raises(ValueError, match=f"target: {cls} uses ALiBi attention biases"):
        specmm.SpeculativeGenerator(model, PromptLookupDrafter())
    with pytest.raises(ValueError, match=f"drafter: {cls} uses ALiBi attention biases"):
        ModelDrafter(model)


def test_llama4_temperature_tuned_queries_are_exact_below_their_slot_and_refused_past_it():
    """Llama 4 scales its NoPE layers' queries by the cache slot from slot floor_scale - 1 on (counted as generate
    fills its cache, while specmm's caches also hold a round): generations whose caches stay below it equal
    generate's; longer ones are refused before any forward."""
    target = tiny_model("llama4", floor_scale=200)
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=2)  # 11 slots: 11 + 100 + a chain-3 round fit in 128 < 199
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=100, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=specmm.TreeSpec.chain(3))
    assert torch.equal(gen.generate(ids, attention_mask=mask, max_new_tokens=100).sequences, reference)
    forwards = counting(target)
    with pytest.raises(ValueError, match="scales the queries of its NoPE layers by their cache slot from slot 199"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=190)
    assert forwards == []


# model, what refuses it: before the check, RWKV decoded silently wrong tokens (its `state` ignored the cache), T5
# failed inside HF ("You must specify exactly one of input_ids or inputs_embeds"), TrOCR's decoder (no position ids)
# gave a dynamic tree other tokens than generate on a ragged batch
STATE_MODELS = {
    "rwkv": (lambda: RwkvForCausalLM(RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                attention_hidden_size=32, intermediate_size=64)), "recurrent"),
    "xlstm": (lambda: xLSTMForCausalLM(xLSTMConfig(vocab_size=VOCAB, hidden_size=32, embedding_dim=32, num_heads=2,
                                                   num_blocks=1)), "recurrent"),
    "recurrent_gemma": (lambda: RecurrentGemmaForCausalLM(RecurrentGemmaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        lru_width=32)), "recurrent"),
    "t5": (lambda: T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1,
                                                       num_heads=2, d_kv=16)), "encoder-decoder"),
    "trocr": (lambda: TrOCRForCausalLM(TrOCRConfig(vocab_size=VOCAB, d_model=32, decoder_layers=1,
                                                   decoder_attention_heads=2, decoder_ffn_dim=64)), "positions"),
    "lfm2": (lambda: Lfm2ForCausalLM(Lfm2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               layer_types=["conv", "full_attention"])), "conv"),
}


@pytest.mark.parametrize("name", list(STATE_MODELS))
def test_models_with_a_state_no_draft_can_be_cut_from_are_refused_as_target_and_drafter(name):
    """Refused before any forward, naming the role and the class, whichever sign transformers gives of the state
    (its flags and layer-type names differ across 5.x)."""
    build, kind = STATE_MODELS[name]
    model = build().eval()
    forwards = counting(model)
    cls = type(model).__name__
    reason = {"recurrent": "recurrent state", "encoder-decoder": "encoder-decoder", "positions": "positions",
              "conv": "conv"}[kind]
    with pytest.raises(ValueError, match=rf"^target: {cls} .*{reason}"):
        specmm.SpeculativeGenerator(model, PromptLookupDrafter())
    with pytest.raises(ValueError, match=rf"^drafter: {cls} .*{reason}"):
        ModelDrafter(model)
    if kind == "recurrent":
        with pytest.raises(ValueError, match=rf"^draft: {cls} .*{reason}"):
            specmm.reasoning.StepSpeculator(tiny_model("llama"), model, tokenizer=None)
    assert forwards == []


@pytest.mark.parametrize("config, layer_types", [({"_is_stateful": True}, None), ({}, ["linear_attention"]),
                                                 ({}, ["recurrent", "attention"]), ({}, ["full_attention"])],
                         ids=["flag", "linear-attention", "recurrent-block", "attention-only"])
def test_recurrent_state_reads_every_sign_transformers_has_given(config, layer_types):
    model = tiny_model("llama")
    if config:
        model = type("FlaggedLlama", (type(model),), config)(model.config)
    if layer_types is not None:
        model.config.layers_block_type = layer_types
    found = recurrent_state(model)
    assert (found is None) == (layer_types == ["full_attention"])


def test_no_tree_node_past_a_rows_token_budget_is_verified(monkeypatch):
    target = tiny_model("llama")
    ids, mask = left_padded_batch([4, 7], seed=3)
    seen = []
    verify = specmm.core.HFCausalLMTarget.verify

    def recording(self, tree):
        seen.append(int(torch.where(tree.valid, tree.depth, 0).max()))
        assert int(tree.depth.max()) <= seen[-1]  # cut nodes sit at depth 0: no position past the budget
        return verify(self, tree)

    monkeypatch.setattr(specmm.core.HFCausalLMTarget, "verify", recording)
    out = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=specmm.TreeSpec.chain(8)).generate(
        ids, attention_mask=mask, max_new_tokens=5)
    assert seen == [4] and out.sequences.shape[1] == ids.shape[1] + 5  # one forward: 4 drafts + the bonus
