"""Dream (Qwen2 layout, shifted logits) and HF masked-LM adapters: alignment, bidirectionality, SSD exact."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForMaskedLM, Qwen2Config, Qwen2ForCausalLM

from specmm.diffusion_lm import DreamAdapter, MaskedLMAdapter, generate

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
