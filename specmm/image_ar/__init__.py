"""Speculative decoding for autoregressive image models: LlamaGen and stock generators (`ImageModel` adapters),
guidance-aware target, Jacobi and EAGLE-style
proposers, exact / SJD / LANTERN / LANTERN++ / GSD acceptance, ImageSampler and image-quality metrics."""

from specmm.image_ar.acceptance import (
           GSD,
           SJD,
           Exact,
           Lantern,
           LanternPP,
           codebook_neighbours,
)
from specmm.image_ar.drafter import DraftHead, ImageDrafter
from specmm.image_ar.jacobi import JacobiProposer
from specmm.image_ar.llamagen import GPTConfig, LlamaGen, LlamaGenGPT, VQConfig, VQModel
from specmm.image_ar.models import ImageModel, image_model_for, register_image_model
from specmm.image_ar.sampler import ImageSample, ImageSampler
from specmm.image_ar.target import GuidedTarget
from specmm.image_ar.trees import lantern_pp_tree

__all__ = ["GSD", "SJD", "DraftHead", "Exact", "GPTConfig", "GuidedTarget", "ImageDrafter", "ImageModel", "ImageSample",
           "ImageSampler", "JacobiProposer", "Lantern", "LanternPP", "LlamaGen", "LlamaGenGPT", "VQConfig", "VQModel",
           "codebook_neighbours", "image_model_for", "lantern_pp_tree", "register_image_model"]
