"""MaskedDiffusionLM: LLaDA's key layout and config names load and run; logits match an independent
re-derivation of LLaDA's block from the raw state dict; attention is bidirectional."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from specmm.diffusion_lm import MaskedDiffusionLM, generate
from tests.diffusion_lm.conftest import MASK, tiny_dlm

LAYER_KEYS = ["attn_norm.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "attn_out.weight",
              "ff_norm.weight", "ff_proj.weight", "up_proj.weight", "ff_out.weight"]


def llada_state_dict(layers: int, d: int, kv: int, mlp: int, vocab: int, seed: int = 0) -> dict:
    """Random weights under LLaDA's own key names (as in the hub checkpoints)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * 0.3

    state = {"model.transformer.wte.weight": w(vocab, d), "model.transformer.ln_f.weight": 1 + w(d),
             "model.transformer.ff_out.weight": w(vocab, d)}
    shapes = {"attn_norm.weight": (d,), "q_proj.weight": (d, d), "k_proj.weight": (kv, d), "v_proj.weight": (kv, d),
              "attn_out.weight": (d, d), "ff_norm.weight": (d,), "ff_proj.weight": (mlp, d),
              "up_proj.weight": (mlp, d), "ff_out.weight": (d, mlp)}
    for i in range(layers):
        for key in LAYER_KEYS:
            value = w(*shapes[key])
            state[f"model.transformer.blocks.{i}.{key}"] = 1 + value if value.dim() == 1 else value
    return state


LLADA_CONFIG = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 16, "n_heads": 4,
                "n_kv_heads": 2, "n_layers": 2, "mlp_hidden_size": 24, "vocab_size": 30, "embedding_size": 30,
                "mask_token_id": 29, "eos_token_id": 1, "max_sequence_length": 64, "rope_theta": 10000.0,
                "rms_norm_eps": 1e-5, "weight_tying": False, "block_type": "llama", "activation_type": "silu",
                "include_bias": False, "layer_norm_type": "rms", "rope": True, "mlp_ratio": 4, "use_cache": False}


def reference_logits(state: dict, ids: torch.Tensor, c: dict) -> torch.Tensor:
    """LLaDA's forward written out from the math: RMSNorm, complex-number RoPE, softmax attention, SwiGLU."""
    d, h, hk = c["d_model"], c["n_heads"], c["n_kv_heads"]
    hd = d // h
    t = ids.shape[1]

    def norm(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])

    angles = (torch.arange(t, dtype=torch.float64)[:, None]
              * c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def rope(x):  # pairs (i, i + hd/2) rotate together
        z = torch.complex(x[..., : hd // 2], x[..., hd // 2:]) * torch.polar(torch.ones_like(angles), angles)
        return torch.cat((z.real, z.imag), dim=-1)

    x = state["model.transformer.wte.weight"][ids]
    for i in range(c["n_layers"]):
        p = {k: state[f"model.transformer.blocks.{i}.{k}"] for k in LAYER_KEYS}
        y = norm(x, p["attn_norm.weight"])
        q = rope((y @ p["q_proj.weight"].T).view(1, t, h, hd).transpose(1, 2))
        k = rope((y @ p["k_proj.weight"].T).view(1, t, hk, hd).transpose(1, 2)).repeat_interleave(h // hk, 1)
        v = (y @ p["v_proj.weight"].T).view(1, t, hk, hd).transpose(1, 2).repeat_interleave(h // hk, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5, dim=-1) @ v  # no causal mask
        x = x + att.transpose(1, 2).reshape(1, t, d) @ p["attn_out.weight"].T
        y = norm(x, p["ff_norm.weight"])
        gate = y @ p["ff_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (y @ p["up_proj.weight"].T)) @ p["ff_out.weight"].T
    return norm(x, state["model.transformer.ln_f.weight"]) @ state["model.transformer.ff_out.weight"].T


def test_a_llada_layout_folder_loads_and_matches_the_reference_forward(tmp_path):
    state = llada_state_dict(2, 16, 8, 24, 30)
    (tmp_path / "config.json").write_text(json.dumps(LLADA_CONFIG))
    save_file({k: v.float() for k, v in state.items()}, tmp_path / "model.safetensors")
    model = MaskedDiffusionLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert set(model.state_dict()) == set(state) and model.mask_id == 29
    ids = torch.randint(0, 29, (1, 11), generator=torch.Generator().manual_seed(0))
    expected = reference_logits({k: v.float().double() for k, v in state.items()}, ids, LLADA_CONFIG)
    assert torch.allclose(model.logits(ids), expected, atol=1e-10, rtol=0)
    out = generate(model, ids, 8, 4, method="ssd", draft_size=4)
    assert torch.equal(out.sequences, generate(model, ids, 8, 4, method="stepwise").sequences)


def test_weights_only_bin_and_sharded_safetensors_load_alike(tmp_path):
    state = {k: v.float() for k, v in llada_state_dict(2, 16, 8, 24, 30, seed=1).items()}
    for name in ("bin", "sharded"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(LLADA_CONFIG))
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    keys = sorted(state)
    halves = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2:]}
    for shard, names in halves.items():
        save_file({k: state[k] for k in names}, tmp_path / "sharded" / shard)
    index = {"weight_map": {k: shard for shard, names in halves.items() for k in names}}
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = torch.randint(0, 29, (2, 9), generator=torch.Generator().manual_seed(1))
    a = MaskedDiffusionLM.from_pretrained(tmp_path / "bin").logits(ids)
    b = MaskedDiffusionLM.from_pretrained(tmp_path / "sharded").logits(ids)
    assert torch.equal(a, b)


def test_save_pretrained_round_trip_keeps_llada_names(tmp_path):
    model = tiny_dlm(seed=4)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llada" and config["d_model"] == 32 and config["mask_token_id"] == MASK
    again = MaskedDiffusionLM.from_pretrained(tmp_path, dtype=torch.float64)
    ids = torch.randint(0, 38, (1, 10), generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.logits(ids), model.logits(ids))


def test_attention_is_bidirectional():
    model = tiny_dlm(seed=5)
    ids = torch.randint(0, 38, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 38
    assert not torch.allclose(model.logits(ids)[0, 0], model.logits(changed)[0, 0])
