"""NaN or inf logits raise NonFiniteError naming the model and the step: never silent EOS or zero tokens."""

from __future__ import annotations

import math

import pytest
import torch

import specmm
from specmm.core.finite import FiniteWatch, NonFiniteError, check_finite_steps, nonfinite_rows
from specmm.drafters import ModelDrafter, PromptLookupDrafter
from tests.conftest import left_padded_batch, tiny_model


def nan_weights(model):
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))
    return model


@pytest.mark.parametrize("drafter", ["model", "prompt-lookup"])
def test_nan_weights_raise_naming_the_model_and_the_round(drafter):
    target = nan_weights(tiny_model("llama"))
    target.config.name_or_path = "models/broken-llama"
    proposer = ModelDrafter(tiny_model("llama", seed=1)) if drafter == "model" else PromptLookupDrafter(ngram=2, k=3)
    ids, mask = left_padded_batch([5, 3])
    gen = specmm.SpeculativeGenerator(target, proposer, tree=specmm.TreeSpec.chain(3))
    with pytest.raises(NonFiniteError, match=r"LlamaForCausalLM \(models/broken-llama\): non-finite logits \(NaN or "
                                             r"inf\) at decoding round 1 \(rows \[0, 1\]\); .*float32"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=8)


def test_inf_logits_in_one_row_at_a_later_round_name_that_round_and_row():
    target = tiny_model("llama")
    calls = {"n": 0}

    def poison(module, inputs, output):  # the lm_head output: row 1 gets +inf from the 3rd call on
        calls["n"] += 1
        if calls["n"] >= 3:
            output = output.clone()
            output[1, :, 7] = math.inf
        return output

    target.get_output_embeddings().register_forward_hook(poison)
    ids, mask = left_padded_batch([4, 4])
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(tiny_model("llama", seed=1)), tree=specmm.TreeSpec.chain(2))
    with pytest.raises(NonFiniteError, match=r"at decoding round \d+ \(rows \[1\]\)") as err:
        gen.generate(ids, attention_mask=mask, max_new_tokens=30)
    assert "round 1 " not in str(err.value)  # the first verify round was still finite


def test_finite_models_are_untouched_by_the_check():
    target = tiny_model("llama")
    ids, mask = left_padded_batch([5, 3])
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0,
                                eos_token_id=None)
    out = specmm.SpeculativeGenerator(target, ModelDrafter(tiny_model("llama", seed=1)),
                                      tree=specmm.TreeSpec.chain(3)).generate(ids, attention_mask=mask,
                                                                              max_new_tokens=6, pad_token_id=0)
    assert torch.equal(out.sequences, reference)


def test_nonfinite_rows_sees_nan_and_inf_anywhere_and_all_minus_inf_rows():
    logits = torch.zeros(4, 2, 5)
    logits[1, 1, 3] = math.nan
    logits[2, 0, 0] = math.inf
    logits[3, 1] = -math.inf
    logits[0, 0, 1] = -math.inf  # a masked-out token is fine
    assert nonfinite_rows(logits).tolist() == [False, True, True, True]


def test_finite_watch_names_the_first_bad_step_without_syncing_each_step():
    watch = FiniteWatch(torch.nn.Linear(2, 2), "image token")
    for step in range(5):
        logits = torch.zeros(2, 8)
        if step >= 3:
            logits[0, 1] = math.nan
        watch.update(logits, step)
    with pytest.raises(NonFiniteError, match=r"Linear: non-finite logits \(NaN or inf\) at image token 3;"):
        watch.check()
    clean = FiniteWatch(torch.nn.Linear(2, 2))
    clean.update(torch.zeros(2, 8), 0)
    clean.check()


def test_check_finite_steps_names_the_first_step_and_its_rows():
    values = torch.zeros(3, 6, 2)
    values[2, 4, 1] = math.inf
    values[1, 5, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"at generation step 4 of 6 \(rows \[2\]\)"):
        check_finite_steps(values, torch.nn.Linear(1, 1), "token values")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_temperature_must_be_finite(value):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        specmm.SamplingConfig(temperature=value)
