"""Speculative decoding for autoregressive image models: LlamaGen, guidance-aware target, Jacobi and EAGLE-style
proposers, exact / SJD / LANTERN / LANTERN++ / GSD acceptance, ImageSampler and image-quality metrics."""

from specmm.image_ar.llamagen import GPTConfig, LlamaGen, LlamaGenGPT, VQConfig, VQModel
from specmm.image_ar.target import GuidedTarget

__all__ = ["GPTConfig", "GuidedTarget", "LlamaGen", "LlamaGenGPT", "VQConfig", "VQModel"]
