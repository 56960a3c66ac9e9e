"""Tiny random LlamaGen models for the image_ar tests."""

import pytest
import torch

from specmm.image_ar import LlamaGen

TINY_VQ = {"codebook_size": 64, "codebook_embed_dim": 8, "ch": 32, "ch_mult": [1, 2], "z_channels": 32,
           "num_res_blocks": 1}


def tiny_llamagen(vocab: int = 64, block: int = 16, seed: int = 0, dtype=torch.float32, **gpt) -> LlamaGen:
    torch.manual_seed(seed)
    config = {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": vocab, "block_size": block, "num_classes": 10,
              "model_type": "c2i", **gpt}
    lg = LlamaGen.from_config(config, {**TINY_VQ, "codebook_size": vocab}).eval()
    with torch.no_grad():  # a sharper random output head, so distributions are not all flat
        lg.gpt.output.weight.mul_(8.0)
    return lg.to(dtype)


def condition(target, conditions, cfg_scale, max_nodes):
    """The public conditioning hook: an empty prompt plus conditions; returns image token 0's logits [B, V]."""
    target.start(conditions.shape[0])
    prompt = torch.zeros(conditions.shape[0], 0, dtype=torch.long)
    return target.prefill(prompt, prompt, conditions=conditions, cfg_scale=cfg_scale, max_nodes=max_nodes).next_logits


@pytest.fixture(scope="module")
def lg():
    return tiny_llamagen()
