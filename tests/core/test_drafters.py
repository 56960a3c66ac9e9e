"""Drafters: prompt lookup finds the right n-gram, EAGLE loads the upstream layout and learns from its target."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import specmm
from specmm.core.eagle_train import EagleTrainConfig, train_eagle
from specmm.drafters import EagleDrafter, PromptLookupDrafter
from tests.conftest import left_padded_batch, tiny_model

# ----------------------------------------------------------------------------------------- prompt lookup


def test_prompt_lookup_copies_the_latest_match_of_the_longest_ngram():
    drafter = PromptLookupDrafter(ngram=2, k=3)
    #                      A  B  C  D  A  B  E  F  G  A  B    -> latest "A B" is followed by E F G
    row0 = torch.tensor([[5, 6, 7, 8, 5, 6, 9, 10, 11, 5, 6]])
    row1 = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]])  # left-padded, no repeat: nothing to propose
    ids = torch.cat([row0, row1])
    mask = torch.cat([torch.ones(1, 11), (row1 > 0).float()]).long()
    drafter.start(ids, mask, None)
    tree = drafter.draft(ids[:, -1], specmm.TreeSpec.chain(3), specmm.SamplingConfig(0.0), None)
    assert tree.tokens[0].tolist() == [6, 9, 10, 11]
    assert tree.valid.tolist() == [[True, True, True, True], [True, False, False, False]]


def test_prompt_lookup_falls_back_to_shorter_ngrams_and_repeats_past_the_context_end():
    drafter = PromptLookupDrafter(ngram=3, k=4)
    ids = torch.tensor([[1, 2, 3, 9, 2, 3]])  # "9 2 3" and "2 3"... only "3" -> continuation after 2nd-to-last 3
    drafter.start(ids, torch.ones_like(ids), None)
    tree = drafter.draft(ids[:, -1], specmm.TreeSpec.chain(4), specmm.SamplingConfig(0.0), None)
    # "2 3" occurs at positions 1-2, followed by 9 2 3 until the end of the context; the copy then overlaps
    # itself (period 3), so the fourth draft is 9 again
    assert tree.tokens[0, 1:].tolist() == [9, 2, 3, 9] and tree.valid[0].tolist() == [True] * 5


def test_prompt_lookup_drafts_a_short_loop_k_deep():
    drafter = PromptLookupDrafter(ngram=2, k=5)
    ids = torch.tensor([[4, 7, 8, 7, 8, 7, 8]])  # latest earlier "7 8" is two back: the loop 7 8 goes on
    drafter.start(ids, torch.ones_like(ids), None)
    tree = drafter.draft(ids[:, -1], specmm.TreeSpec.chain(5), specmm.SamplingConfig(0.0), None)
    assert tree.tokens[0, 1:].tolist() == [7, 8, 7, 8, 7] and bool(tree.valid.all())


def test_prompt_lookup_takes_int32_ids():
    drafter = PromptLookupDrafter(ngram=2, k=3)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6]], dtype=torch.int32)
    drafter.start(ids, torch.ones_like(ids), None)
    tree = drafter.draft(ids[:, -1].long(), specmm.TreeSpec.chain(3), specmm.SamplingConfig(0.0), None)
    assert tree.tokens[0].tolist() == [6, 7, 8, 5]
    result = specmm.core.AcceptResult(path=torch.tensor([[0, 1, 2, 3]]), num_accepted=torch.tensor([3]),
                                 next_token=torch.tensor([9]))
    drafter.update(tree, result, None)  # writes the long accepted tokens into the history
    assert drafter.history[0, :10].tolist() == [5, 6, 7, 8, 5, 6, 7, 8, 5, 9]


# ------------------------------------------------------------------------------------------------ EAGLE

UPSTREAM_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 512,
    "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2,
    "pad_token_id": 0, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
    "vocab_size": 96,
}


def upstream_state(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights under the upstream EAGLE-1/2 key names (vlm.md section 1)."""
    h, i, kv = 32, 64, 2 * 8
    shapes = {"embed_tokens.weight": (96, h), "fc.weight": (h, 2 * h), "fc.bias": (h,),
              "layers.0.self_attn.q_proj.weight": (h, h), "layers.0.self_attn.k_proj.weight": (kv, h),
              "layers.0.self_attn.v_proj.weight": (kv, h), "layers.0.self_attn.o_proj.weight": (h, h),
              "layers.0.mlp.gate_proj.weight": (i, h), "layers.0.mlp.up_proj.weight": (i, h),
              "layers.0.mlp.down_proj.weight": (h, i), "layers.0.post_attention_layernorm.weight": (h,)}
    return {k: torch.randn(s, generator=gen, dtype=torch.float64) * 0.2 for k, s in shapes.items()}


def reference_eagle_layer(w, token_embeds, features):
    """EAGLE-1/2 head written out by hand: fc(cat(emb, feature)) -> attention (no input norm) -> MLP."""
    x = torch.cat([token_embeds, features], -1) @ w["fc.weight"].T + w["fc.bias"]  # [L, H]
    n, heads, kv_heads, dim = x.shape[0], 4, 2, 8
    q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, heads, dim).transpose(0, 1)
    k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, kv_heads, dim).transpose(0, 1)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, kv_heads, dim).transpose(0, 1)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotate = lambda t: torch.cat([-t[..., dim // 2:], t[..., : dim // 2]], -1)  # noqa: E731
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(dim) + torch.full((n, n), -math.inf).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * dim) @ w["layers.0.self_attn.o_proj.weight"].T
    x = x + attn
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w["layers.0.post_attention_layernorm.weight"]
    mlp = (F.silu(normed @ w["layers.0.mlp.gate_proj.weight"].T) * (normed @ w["layers.0.mlp.up_proj.weight"].T))
    return x + mlp @ w["layers.0.mlp.down_proj.weight"].T


def test_eagle_loads_the_upstream_checkpoint_layout_and_computes_the_eagle_layer(tmp_path):
    target = tiny_model("llama")
    state = upstream_state(torch.Generator().manual_seed(0))
    torch.save({k: v.half() for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(UPSTREAM_CONFIG))
    drafter = EagleDrafter.from_pretrained(tmp_path, target)
    weights = {k: v.half().double() for k, v in state.items()}
    tokens = torch.tensor([[4, 17, 9, 60, 2]])
    features = torch.randn(1, 5, 32, dtype=torch.float64)
    got = drafter.head(drafter.embed_tokens(tokens), features).last_hidden_state[0]
    want = reference_eagle_layer(weights, target.get_input_embeddings()(tokens)[0], features[0])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # HF computes rotary angles in float32


def test_eagle_rejects_a_checkpoint_with_wrong_keys(tmp_path):
    state = upstream_state(torch.Generator().manual_seed(0))
    state["layers.0.input_layernorm.weight"] = torch.ones(32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(UPSTREAM_CONFIG))
    with pytest.raises(ValueError, match="unexpected.*input_layernorm"):
        EagleDrafter.from_pretrained(tmp_path, tiny_model("llama"))


def test_eagle_save_and_load_round_trip(tmp_path):
    target = tiny_model("llama")
    torch.manual_seed(3)
    drafter = EagleDrafter.for_target(target)
    drafter.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = EagleDrafter.from_pretrained(tmp_path, target)
    for (key, a), b in zip(drafter.head.upstream_state_dict().items(), loaded.head.upstream_state_dict().values()):
        assert torch.equal(a, b), key


def self_distillation_data(target, count: int, seed: int):
    """Target greedy continuations of random prompts: what the head must learn to predict."""
    ids, mask = left_padded_batch([6] * count, seed=seed)
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=26, pad_token_id=0)


def test_eagle_training_raises_acceptance_and_resumes(tmp_path):
    target = tiny_model("llama", dtype=torch.float32, logit_scale=8.0)
    data = self_distillation_data(target, 64, seed=1)
    batches = [data[i: i + 16] for i in range(0, 64, 16)]
    prompts, mask = left_padded_batch([6, 6, 6, 6], seed=99)
    torch.manual_seed(0)
    drafter = EagleDrafter.for_target(target)

    def acceptance():
        gen = specmm.SpeculativeGenerator(target, drafter, tree=specmm.TreeSpec.chain(3))
        out = gen.generate(prompts, attention_mask=mask, max_new_tokens=24)
        reference = target.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0)
        assert torch.equal(out.sequences, reference)
        return out.stats.mean_accepted

    before = acceptance()
    config = EagleTrainConfig(steps=40, lr=3e-3, warmup_steps=5, checkpoint_every=20)
    first = train_eagle(drafter, target, batches, EagleTrainConfig(**{**config.__dict__, "steps": 20}),
                        checkpoint_dir=tmp_path, progress=False)
    resumed = train_eagle(drafter, target, batches, config, checkpoint_dir=tmp_path, progress=False)
    assert len(first) == 20 and len(resumed) == 20  # the second call picked up at step 20
    more = train_eagle(drafter, target, batches, EagleTrainConfig(**{**config.__dict__, "steps": 400}),
                       checkpoint_dir=tmp_path, progress=False)
    assert sum(more[-10:]) / 10 < 0.7 * sum(first[:5]) / 5
    after = acceptance()
    assert after > before + 0.5, f"mean accepted {before:.2f} -> {after:.2f}"


def test_eagle_drafts_of_a_left_padded_row_equal_its_drafts_alone():
    """Every round's draft tree of a padded row equals the row's own when it runs unpadded, the first round's
    too (its pending prompt slots start with padding, so the root is the last valid slot, not the count's)."""
    target = tiny_model("llama")
    torch.manual_seed(3)
    drafter = EagleDrafter.for_target(target)
    ids, mask = left_padded_batch([9, 4, 6], seed=2)
    spec = specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4)

    def trees(input_ids, attention_mask):
        recorded = []
        original = drafter.draft
        drafter.draft = lambda *args: recorded.append(original(*args)) or recorded[-1]
        try:
            specmm.SpeculativeGenerator(target, drafter, tree=spec).generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, pad_token_id=0)
        finally:
            del drafter.draft
        return recorded

    batched = trees(ids, mask)
    for row in range(ids.shape[0]):
        alone = trees(ids[row][mask[row].bool()][None], torch.ones(1, int(mask[row].sum()), dtype=torch.long))
        rounds = min(len(alone), len(batched))
        assert rounds >= 2
        for r in range(rounds):
            assert torch.equal(batched[r].tokens[row], alone[r].tokens[0]), (row, r)
