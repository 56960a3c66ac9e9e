"""Tiny random stock HF image generators and their processors, built offline (shared by the Janus and Emu3 tests)."""

from __future__ import annotations

import torch
import transformers as hf
from tokenizers import Tokenizer, models, pre_tokenizers, processors

WORDS = ["a", "red", "cat", "blue", "dog", "on", "the", "mat", "under", "sky", "big", "small", "green", "tree"]


def word_tokenizer(specials: dict[str, str], bos: str = "<bos>", eos: str = "<eos>", pad: str = "<pad>",
                   words: list[str] = WORDS) -> hf.PreTrainedTokenizerFast:
    """A word-level tokenizer that puts `bos` first, with `specials` ({attribute: token}) as extra special tokens."""
    vocab = {token: i for i, token in enumerate([pad, bos, eos, *specials.values(), *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=pad))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    tokenizer = hf.PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=eos, pad_token=pad,
                                           extra_special_tokens=specials, model_max_length=1 << 12)
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials.values())})
    return tokenizer


JANUS_SPECIALS = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}


def janus_processor(tokens_per_image: int = 16) -> hf.JanusProcessor:
    tokenizer = word_tokenizer(JANUS_SPECIALS)
    images = hf.JanusImageProcessor(size={"height": 16, "width": 16}, min_size=4)
    return hf.JanusProcessor(images, tokenizer, num_image_tokens=tokens_per_image)


def tiny_janus(codes: int = 32, grid: int = 4, seed: int = 0, dtype=torch.float64, head_scale: float = 4.0):
    """A random JanusForConditionalGeneration: 2-layer Llama (d=32), `codes` image codes on a `grid` x `grid`
    token image, a VQ decoder to 2*grid px; the generation config carries BOS / BOI / pad as Janus-Pro's does."""
    tokenizer = janus_processor(grid * grid).tokenizer
    torch.manual_seed(seed)
    text = hf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    vision = hf.JanusVisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=4 * grid,
                                  patch_size=4, projection_dim=32, num_image_tokens=grid * grid, depth=1)
    vq = hf.JanusVQVAEConfig(embed_dim=8, num_embeddings=codes, latent_channels=32, base_channels=32,
                             channel_multiplier=[1, 2], num_res_blocks=1, projection_dim=32,
                             image_token_embed_dim=32, num_hidden_layers=2)
    config = hf.JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                            image_token_id=tokenizer.convert_tokens_to_ids(JANUS_SPECIALS["image_token"]))
    model = hf.JanusForConditionalGeneration(config).eval()
    with torch.no_grad():  # unit-scale random weights and a sharper image head: varied, not flat, distributions
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and "vqmodel" not in name:
                weight.normal_(0.0, weight.shape[1] ** -0.5)
        model.model.generation_head.vision_head.weight.mul_(head_scale)
    g = model.generation_config
    g.bos_token_id, g.pad_token_id = tokenizer.bos_token_id, tokenizer.pad_token_id
    g.generation_kwargs = {"boi_token_id": tokenizer.convert_tokens_to_ids(JANUS_SPECIALS["boi_token"])}
    g._from_model_config = False  # a checkpoint's own generation config: from_pretrained keeps it as saved
    return model.to(dtype)
