"""Diffusion language models (LLaDA / Dream layouts) and their decoders: stepwise reference, lossless
self-speculative decoding (SSD), and lossy parallel baselines (LLaDA low-confidence, Fast-dLLM threshold,
Prophet early commit)."""

from specmm.diffusion_lm.adapters import DreamAdapter, MaskedLMAdapter, as_diffusion_lm
from specmm.diffusion_lm.generate import LOSSLESS, METHODS, DiffusionOutput, generate
from specmm.diffusion_lm.model import LLaDAConfig, MaskedDiffusionLM, PrefixCache
from specmm.diffusion_lm.training import masked_diffusion_loss

__all__ = ["LOSSLESS", "METHODS", "DiffusionOutput", "DreamAdapter", "LLaDAConfig",
           "MaskedDiffusionLM", "MaskedLMAdapter", "PrefixCache", "as_diffusion_lm", "generate",
           "masked_diffusion_loss"]
