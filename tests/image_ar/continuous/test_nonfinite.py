"""Continuous tokens: NaN weights raise naming the model and the generation step, never zero or NaN latents."""

from __future__ import annotations

import math

import pytest
import torch

from specmm.core.finite import NonFiniteError
from specmm.image_ar.continuous import CSpDSampler, sample_ar
from tests.image_ar.continuous.conftest import tiny_model


def broken(seed: int = 0):
    model = tiny_model(seed)
    with torch.no_grad():
        for p in model.head.parameters():
            p.fill_(math.nan)
    return model


def test_plain_ar_with_nan_weights_raises_at_the_first_step():
    with pytest.raises(NonFiniteError, match=r"ContinuousAR: non-finite token values \(NaN or inf\) at generation "
                                             r"step 0 of 4 \(rows \[0, 1\]\)"):
        sample_ar(broken(), torch.tensor([0, 2]), generator=torch.Generator().manual_seed(0))


def test_cspd_with_a_nan_target_raises():
    sampler = CSpDSampler(broken(), tiny_model(1), draft_tokens=2, max_proposals=4)
    with pytest.raises(NonFiniteError, match="ContinuousAR: non-finite token values"):
        sampler.sample(torch.tensor([1]), generator=torch.Generator().manual_seed(0))
