"""Image AR: NaN weights raise naming the model and the step (never all-zero image tokens); guidance must be finite."""

from __future__ import annotations

import math

import pytest
import torch

from specmm.core.finite import NonFiniteError
from specmm.image_ar import ImageSampler
from tests.image_ar.conftest import tiny_llamagen


@pytest.fixture(scope="module")
def broken():
    lg = tiny_llamagen()
    with torch.no_grad():
        lg.gpt.output.weight[:, 3] = math.nan  # one hidden unit: every logit turns NaN
    return lg


# the conditioning prefill draws token 0 (target forward 1); the first verify is target forward 2
@pytest.mark.parametrize("proposer, where", [("ar", r"image token 0"), ("jacobi", r"decoding round 2")])
def test_nan_weights_raise_instead_of_zero_tokens(broken, proposer, where):
    with pytest.raises(NonFiniteError, match=rf"LlamaGenGPT: non-finite logits \(NaN or inf\) at {where}"):
        ImageSampler(broken, proposer=proposer).sample(torch.tensor([1, 2]), temperature=0.0, decode=False)


@pytest.mark.parametrize("cfg_scale", [math.inf, math.nan])
def test_guidance_scale_must_be_finite(lg, cfg_scale):
    with pytest.raises(ValueError, match="cfg_scale: expected a finite number >= 1"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1]), cfg_scale=cfg_scale)
