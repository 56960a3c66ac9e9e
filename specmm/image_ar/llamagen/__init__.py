"""LlamaGen in specmm's own code: GPT (c2i / t2i), VQ tokenizer, upstream checkpoint layout and presets."""

from specmm.image_ar.llamagen.config import (
           GPT_PRESETS,
           VQ_PRESETS,
           GPTConfig,
           VQConfig,
           gpt_config,
           vq_config,
)
from specmm.image_ar.llamagen.gpt import KVCache, LlamaGenGPT, rope_table_2d
from specmm.image_ar.llamagen.model import LlamaGen, load_state
from specmm.image_ar.llamagen.vq import VQModel

__all__ = [
           "GPT_PRESETS",
           "VQ_PRESETS",
           "GPTConfig",
           "KVCache",
           "LlamaGen",
           "LlamaGenGPT",
           "VQConfig",
           "VQModel",
           "gpt_config",
           "load_state",
           "rope_table_2d",
           "vq_config",
]
