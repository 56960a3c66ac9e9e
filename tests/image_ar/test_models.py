"""`ImageSampler.for_model` dispatch: LlamaGen through its adapter, unsupported classes named with what is supported."""

import pytest
import torch
from torch import nn

from specmm.image_ar import ImageSampler, image_model_for
from specmm.image_ar.models import supported_models


class PixArtForImageGeneration(nn.Module):
    pass


def test_unsupported_generator_names_the_class_and_what_is_supported():
    with pytest.raises(ValueError, match=r"PixArtForImageGeneration is not an image generator.*supported: LlamaGen"):
        ImageSampler.for_model(PixArtForImageGeneration(), None)
    with pytest.raises(ValueError, match="lg: expected a LlamaGen or an ImageModel"):
        ImageSampler(PixArtForImageGeneration())


def test_llamagen_adapter_serves_the_sampler(lg):
    sampler = ImageSampler.for_model(lg, proposer="jacobi", window=4)
    ar = ImageSampler(image_model_for(lg), proposer="ar")
    a = sampler.sample(torch.tensor([1, 2]), cfg_scale=2.0, temperature=0.0, decode=False)
    assert torch.equal(a.tokens, ar.sample(torch.tensor([1, 2]), cfg_scale=2.0, temperature=0.0, decode=False).tokens)
    assert "LlamaGen" in supported_models() and "JanusForConditionalGeneration" in supported_models()
    with pytest.raises(ValueError, match="negative_prompt: not a sampling option of LlamaGen"):
        sampler.sample(torch.tensor([1]), negative_prompt="blurry")


def test_a_latent_size_is_refused_for_a_generator_of_one_size(lg):
    with pytest.raises(ValueError, match="latent_size: LlamaGen generates images of one size.*Emu3ForConditional"):
        image_model_for(lg, latent_size=(2, 3))
