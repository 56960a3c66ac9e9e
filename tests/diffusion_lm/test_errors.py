"""Bad input gets a ValueError naming the argument before any forward runs."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from specmm.diffusion_lm import LLaDAConfig, MaskedDiffusionLM, generate
from tests.diffusion_lm.conftest import MASK, tiny_dlm

IDS = torch.ones(1, 4, dtype=torch.long)


def test_missing_mask_id():
    model = MaskedDiffusionLM(LLaDAConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=16, vocab_size=20,
                                          mask_token_id=None))
    with pytest.raises(ValueError, match="mask_id"):
        generate(model, IDS, 8, 4)
    bert = BertForMaskedLM(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16))
    with pytest.raises(ValueError, match="mask_id"):
        generate(bert, IDS, 8, 4)


@pytest.mark.parametrize("kwargs,name", [
    ({"gen_length": 10, "block_length": 4}, "block_length"),
    ({"gen_length": 0, "block_length": 4}, "gen_length"),
    ({"gen_length": 200, "block_length": 8}, "context"),
    ({"method": "beam"}, "method"),
    ({"cache": "dual"}, "cache"),
    ({"draft_size": 0}, "draft_size"),
    ({"confidence": "entropy"}, "confidence"),
    ({"threshold": 1.5, "method": "threshold"}, "threshold"),
    ({"gen_length": True, "block_length": 1}, "gen_length"),
    ({"draft_size": 2.5}, "draft_size"),
    ({"prophet_thresholds": (1.0,), "method": "prophet"}, "prophet_thresholds"),
    ({"mask_id": 10_000}, "mask_id: 10000 is outside the model's vocabulary"),
])
def test_bad_arguments(kwargs, name):
    args = {"gen_length": 8, "block_length": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        generate(tiny_dlm(), IDS, **args)


def test_prompt_longer_than_the_context():
    with pytest.raises(ValueError, match="input_ids.*exceeds the model's context of 96"):
        generate(tiny_dlm(), torch.ones(1, 90, dtype=torch.long), 8, 4)


def test_padding_with_the_mask_id_and_bad_shapes():
    ids = torch.tensor([[MASK, 3, 4]])
    with pytest.raises(ValueError, match="padding uses the mask id"):
        generate(tiny_dlm(), ids, 4, 4, attention_mask=torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="attention_mask"):
        generate(tiny_dlm(), ids, 4, 4, attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="input_ids"):
        generate(tiny_dlm(), ids[0], 4, 4)
    with pytest.raises(ValueError, match="attention_mask: the last column must be all ones"):
        generate(tiny_dlm(), torch.tensor([[3, 4, 0]]), 4, 4, attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="attention_mask: expected 0 .* and 1 .* only"):
        generate(tiny_dlm(), torch.tensor([[3, 4, 5]]), 4, 4, attention_mask=torch.tensor([[2, 1, 1]]))
    with pytest.raises(ValueError, match=r"input_ids: token ids must be in \[0, "):
        generate(tiny_dlm(), torch.tensor([[3, -4, 5]]), 4, 4)


def test_prefix_cache_needs_a_model_with_one():
    bert = BertForMaskedLM(BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16))
    with pytest.raises(ValueError, match="cache"):
        generate(bert, IDS, 8, 4, mask_id=19, cache="prefix")


def test_unsupported_model():
    with pytest.raises(ValueError, match="model"):
        generate(torch.nn.Linear(2, 2), IDS, 8, 4, mask_id=1)


@pytest.mark.parametrize("method", ["stepwise", "ssd"])
def test_nan_weights_raise_naming_the_model_and_the_forward(method):
    from specmm.core.finite import NonFiniteError

    model = tiny_dlm()
    with torch.no_grad():
        next(p for name, p in model.named_parameters() if name.endswith("weight")).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"MaskedDiffusionLM: non-finite logits \(NaN or inf\) at diffusion "
                                             r"forward 1 \(rows \[0\]\)"):
        generate(model, IDS, 8, 4, method=method)
