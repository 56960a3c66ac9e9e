"""Dream (Qwen2 layout, shifted logits) and HF masked-LM adapters: alignment, bidirectionality, SSD exact;
upstream LLaDA and Dream folders (and remote-code objects) load as published."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, Qwen2Config, Qwen2ForCausalLM

from specmm.diffusion_lm import DreamAdapter, LLaDAConfig, MaskedDiffusionLM, MaskedLMAdapter, as_diffusion_lm, generate
from tests.diffusion_lm.test_model import LLADA_CONFIG, llada_state_dict, reference_logits

VOCAB = 40


def tiny_qwen2() -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # sharper predictions
    return model


def test_dream_adapter_shifts_by_one_and_attends_both_ways():
    model = tiny_qwen2()
    dream = DreamAdapter(model, mask_id=VOCAB - 1)
    ids = torch.randint(0, VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(0))
    full = torch.ones(1, 1, 9, 9, dtype=torch.bool)
    raw = model(input_ids=ids, attention_mask=full).logits
    logits = dream.logits(ids)
    assert torch.equal(logits[:, 1:], raw[:, :-1])  # position i is predicted from hidden state i - 1
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % (VOCAB - 1)
    assert not torch.allclose(dream.logits(changed)[0, 2], logits[0, 2])  # a later token changes earlier rows


def test_ssd_is_exact_through_the_dream_adapter_with_a_padded_batch():
    model = tiny_qwen2()
    ids = torch.randint(0, VOCAB - 1, (2, 6), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :2] = 0
    kw = {"mask_id": VOCAB - 1, "attention_mask": attention_mask}
    ref = generate(model, ids, 12, 4, method="stepwise", **kw)
    out = generate(model, ids, 12, 4, method="ssd", draft_size=4, tree_width=2, **kw)
    assert torch.equal(out.sequences, ref.sequences)


def test_ssd_is_exact_through_a_hf_masked_lm():
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    bert = BertForMaskedLM(config).double().eval()
    adapter = MaskedLMAdapter(bert, mask_id=VOCAB - 1)
    ids = torch.randint(0, VOCAB - 1, (1, 5), generator=torch.Generator().manual_seed(2))
    ref = generate(adapter, ids, 12, 6, method="stepwise")
    out = generate(bert, ids, 12, 6, method="ssd", mask_id=VOCAB - 1, draft_size=6)
    assert torch.equal(out.sequences, ref.sequences)


def test_a_left_padded_row_through_a_hf_masked_lm_equals_the_row_alone():
    """Absolute position embeddings (BERT) must count each row's real tokens, not its padding."""
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64)
    torch.manual_seed(2)
    bert = BertForMaskedLM(config).double().eval()
    ids, mask = torch.tensor([[5, 6, 7, 8], [0, 0, 7, 8]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    batched = generate(bert, ids, 6, 6, method="ssd", mask_id=VOCAB - 1, attention_mask=mask)
    alone = generate(bert, ids[1:, 2:], 6, 6, method="stepwise", mask_id=VOCAB - 1)
    assert torch.equal(batched.sequences[1, 4:], alone.sequences[0, 2:])


def test_a_mask_id_given_to_generate_leaves_the_models_own():
    model = MaskedDiffusionLM(LLaDAConfig.from_dict(LLADA_CONFIG)).double().eval()
    own = model.mask_id
    ids = torch.tensor([[1, 2, 3]])
    out = generate(model, ids, 4, 4, method="ssd", mask_id=own - 1)
    assert model.mask_id == own and model.config.mask_token_id == own
    assert torch.equal(out.sequences, generate(model, ids, 4, 4, method="stepwise", mask_id=own - 1).sequences)


# ------------------------------------------------------------------ upstream folders, as published

def save_sharded(state: dict, folder, prefix: str = "model") -> None:
    """Two safetensors shards plus the index, the way hub checkpoints are published."""
    from safetensors.torch import save_file

    keys = sorted(state)
    shards = {f"{prefix}-00001-of-00002.safetensors": keys[: len(keys) // 2],
              f"{prefix}-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for shard, names in shards.items():
        save_file({k: state[k].contiguous() for k in names}, folder / shard)
    index = {"metadata": {"total_size": 0}, "weight_map": {k: s for s, names in shards.items() for k in names}}
    (folder / f"{prefix}.safetensors.index.json").write_text(json.dumps(index))


def dream_config(model: Qwen2ForCausalLM) -> dict:
    """config.json of Dream-v0 (DreamConfig fields, remote-code auto_map), at the tiny model's sizes."""
    c = model.config
    return {"architectures": ["DreamModel"], "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
            "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": c.hidden_size,
            "initializer_range": 0.02, "intermediate_size": c.intermediate_size, "mask_token_id": VOCAB - 1,
            "max_position_embeddings": 64, "max_window_layers": 28, "model_type": "Dream",
            "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0,
            "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": c.rope_parameters["rope_theta"],
            "sliding_window": 64, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.46.2", "use_cache": False, "use_sliding_window": False, "vocab_size": VOCAB}


def test_an_upstream_dream_folder_loads_as_it_comes(tmp_path):
    source = tiny_qwen2().float()
    (tmp_path / "config.json").write_text(json.dumps(dream_config(source)))
    save_sharded(source.state_dict(), tmp_path)
    dream = as_diffusion_lm(tmp_path)
    assert isinstance(dream, DreamAdapter) and dream.mask_id == VOCAB - 1
    ids = torch.randint(0, VOCAB - 1, (2, 7), generator=torch.Generator().manual_seed(3))
    assert torch.equal(dream.logits(ids), DreamAdapter(source, VOCAB - 1).logits(ids))
    out = generate(str(tmp_path), ids, 8, 4, method="ssd", draft_size=4)
    assert torch.equal(out.sequences, generate(tmp_path, ids, 8, 4, method="stepwise").sequences)


def test_a_dream_folder_with_other_weights_is_refused(tmp_path):
    source = tiny_qwen2().float()
    (tmp_path / "config.json").write_text(json.dumps(dream_config(source)))
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("q_proj.bias")}
    save_sharded(state, tmp_path)
    with pytest.raises(ValueError, match="not in Dream's \\(Qwen2\\) parameter layout"):
        as_diffusion_lm(tmp_path)


def test_dream_model_type_is_matched_in_any_case():
    model = tiny_qwen2()
    model.config.model_type = "Dream"  # what the hub's DreamConfig reports
    assert isinstance(as_diffusion_lm(model, mask_id=VOCAB - 1), DreamAdapter)


def upstream_llada_config() -> dict:
    """config.json of LLaDA-8B-Instruct (every published field) at the tiny sizes of LLADA_CONFIG."""
    return {**LLADA_CONFIG, "alibi": False, "alibi_bias_max": 8.0, "attention_dropout": 0.0,
            "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
            "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                         "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
            "bias_for_layer_norm": False, "block_group_size": 1, "embedding_dropout": 0.0, "flash_attention": False,
            "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
            "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
            "layer_norm_with_affine": True, "mlp_ratio": 4, "multi_query_attention": None, "pad_token_id": 1,
            "precision": "amp_bf16", "residual_dropout": 0.0, "rope": True, "rope_full_precision": True,
            "scale_logits": False, "transformers_version": "4.46.3", "use_cache": False}


def test_an_upstream_llada_folder_loads_as_it_comes(tmp_path):
    state = {k: v.float() for k, v in llada_state_dict(2, 16, 8, 24, 30, seed=2).items()}
    (tmp_path / "config.json").write_text(json.dumps(upstream_llada_config()))
    save_sharded(state, tmp_path)
    model = as_diffusion_lm(tmp_path, dtype=torch.float64)
    assert isinstance(model, MaskedDiffusionLM) and model.mask_id == 29
    ids = torch.randint(0, 29, (1, 9), generator=torch.Generator().manual_seed(4))
    expected = reference_logits({k: v.double() for k, v in state.items()}, ids, LLADA_CONFIG)
    assert torch.allclose(model.logits(ids), expected, atol=1e-10, rtol=0)


def test_a_remote_code_llada_model_is_served_with_its_own_weights():
    """The hub's LLaDAModelLM (trust_remote_code) has LLaDA's keys and a config with model_type 'llada'."""
    raw = upstream_llada_config()

    class LLaDAModelLM(torch.nn.Module):  # stands in for the remote-code class: same keys, same config fields
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(**raw, to_dict=lambda: raw)
            self.model = MaskedDiffusionLM(LLaDAConfig.from_dict(raw)).model

    hub = LLaDAModelLM().double()
    model = as_diffusion_lm(hub)
    assert isinstance(model, MaskedDiffusionLM) and model.mask_id == 29
    assert model.model.transformer.wte.weight.data_ptr() == hub.model.transformer.wte.weight.data_ptr()


@pytest.mark.parametrize("flag, value", [("alibi", True), ("include_qkv_bias", True), ("rope", False),
                                         ("block_group_size", 2)])
def test_llada_variants_the_architecture_does_not_implement_are_refused(tmp_path, flag, value):
    (tmp_path / "config.json").write_text(json.dumps({**upstream_llada_config(), flag: value}))
    with pytest.raises(ValueError, match=f"config: {flag}="):
        as_diffusion_lm(tmp_path)
