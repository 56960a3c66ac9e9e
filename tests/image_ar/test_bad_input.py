"""Bad input gets a ValueError naming the argument, before any work starts."""

import pytest
import torch

from specmm.core.tree import TreeSpec
from specmm.image_ar import (
    GSD,
    ImageDrafter,
    ImageSampler,
    JacobiProposer,
    Lantern,
    LanternPP,
    LlamaGen,
)
from specmm.image_ar.llamagen import gpt_config

from .conftest import TINY_VQ

GPT = {"dim": 32, "n_layer": 1, "n_head": 2, "vocab_size": 64, "block_size": 16, "num_classes": 10}


def test_class_id_out_of_range(lg):
    with pytest.raises(ValueError, match="conditions: class id 10 out of range"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1, 10]))


def test_vq_codebook_differs_from_gpt_vocabulary():
    with pytest.raises(ValueError, match="vq_config: codebook_size 32 differs from the GPT vocab_size 64"):
        LlamaGen.from_config(GPT, {**TINY_VQ, "codebook_size": 32})


def test_grid_inconsistent_with_block_size():
    with pytest.raises(ValueError, match=r"image_size: the only valid size .* is 8 px .*4x4 token grid.*got 64"):
        LlamaGen.from_config(GPT, TINY_VQ, image_size=64)  # 32x32 grid, the GPT has 4x4
    with pytest.raises(ValueError, match=r"is 8 px .*got 9"):  # 9 // 2 = 4: the old check read it as a 4x4 grid
        LlamaGen.from_config(GPT, TINY_VQ, image_size=9)
    with pytest.raises(ValueError, match="block_size 15 is not a square"):
        gpt_config({**GPT, "block_size": 15})


def test_guidance_scale_below_one(lg):
    with pytest.raises(ValueError, match="cfg_scale: guidance scale must be >= 1"):
        ImageSampler(lg, proposer="jacobi").sample(torch.tensor([1]), cfg_scale=0.5)


def test_guidance_without_null_class():
    lg = LlamaGen.from_config({**GPT, "class_dropout_prob": 0.0}, TINY_VQ)
    with pytest.raises(ValueError, match="cfg_scale: guidance needs a null class"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1]), cfg_scale=2.0)


def test_caption_shape_for_t2i():
    lg = LlamaGen.from_config({**GPT, "model_type": "t2i", "caption_dim": 8, "cls_token_num": 5}, TINY_VQ)
    with pytest.raises(ValueError, match=r"conditions: expected caption embeddings \[B, 5, 8\]"):
        ImageSampler(lg, proposer="ar").sample(torch.zeros(1, 4, 8))


def test_knobs_and_proposers(lg):
    with pytest.raises(ValueError, match="delta"):
        Lantern(k=5, delta=1.5)
    with pytest.raises(ValueError, match="lam"):
        LanternPP(k=5, lam=0.5)
    with pytest.raises(ValueError, match="window"):
        GSD(window=0)
    with pytest.raises(ValueError, match="quantile"):
        GSD(quantile=0.0)
    with pytest.raises(ValueError, match="init"):
        ImageSampler(lg, proposer="jacobi", init="diagonal")
    with pytest.raises(ValueError, match="proposer"):
        ImageSampler(lg, proposer="medusa")
    with pytest.raises(ValueError, match="acceptance"):
        ImageSampler(lg, acceptance="typical")
    with pytest.raises(ValueError, match="window"):
        JacobiProposer(None, window=1)
    with pytest.raises(ValueError, match="top_k"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1]), top_k=-1)
    with pytest.raises(ValueError, match="gpt_ckpt: no checkpoint file"):
        LlamaGen.from_checkpoint("/nonexistent.pt", "/nonexistent_vq.pt", GPT, TINY_VQ)


@pytest.mark.parametrize("change, message", [
    ({"n_head": 4, "n_kv_head": 3}, "n_head 4 must be a multiple of n_kv_head 3"),
    ({"n_kv_head": 4}, "n_head 2 must be a multiple of n_kv_head 4"),
    ({"cls_token_num": 3}, "cls_token_num 3: a c2i GPT embeds its class as 1 token"),
    ({"model_type": "t2i", "caption_dim": 8, "cls_token_num": 0}, "cls_token_num 0"),
    ({"n_layer": 0}, "n_layer must be at least 1"),
    ({"rope_base": 0}, "rope_base must be positive"),
])
def test_gpt_configs_that_cannot_run_are_refused(change, message):
    with pytest.raises(ValueError, match=f"gpt_config: {message}"):
        gpt_config({**GPT, **change})


def test_caption_masks_fit_the_captions():
    t2i = LlamaGen.from_config({**GPT, "model_type": "t2i", "caption_dim": 8, "cls_token_num": 4}, TINY_VQ)
    captions = torch.zeros(2, 4, 8)
    for mask, message in [(torch.ones(2, 3), r"expected shape \[2, 4\]"),
                          (torch.ones(4), r"expected shape .*got \[4\]"),
                          ([[1, 1, 1, 1]] * 2, "expected a tensor, got list")]:
        with pytest.raises(ValueError, match=f"caption_mask: {message}"):
            ImageSampler(t2i, proposer="ar").sample(captions, caption_mask=mask)


def test_class_conditional_models_take_no_caption_mask(lg):
    with pytest.raises(ValueError, match="caption_mask: only a text-conditional"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1, 2]), caption_mask=torch.zeros(2, 1))


def test_a_drafter_must_fit_the_samplers_model_and_trees_need_a_drafter(lg):
    other = LlamaGen.from_config({**GPT, "dim": 64, "n_head": 4}, TINY_VQ)
    with pytest.raises(ValueError, match="proposer: this ImageDrafter was made for a model with dim 64, but the "
                                         "sampler's model has 32"):
        ImageSampler(lg, proposer=ImageDrafter.for_target(other.gpt))
    with pytest.raises(ValueError, match="tree: only an ImageDrafter proposer takes one"):
        ImageSampler(lg, proposer="jacobi", tree=TreeSpec.chain(3))
    with pytest.raises(ValueError, match="generator: expected a torch.Generator or a list of them"):
        ImageSampler(lg, proposer="ar").sample(torch.tensor([1]), generator=5)
