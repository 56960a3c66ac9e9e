"""VLM targets (LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, Idefics3, SmolVLM,
InternVL) and the captioning pipeline; importing registers the targets."""

from specmm.vlm.targets import LlavaTarget, Qwen2_5_VLTarget, VLMTarget, is_vision_language_model, vlm_target
from specmm.vlm.families import Gemma3Target, Idefics3Target, InternVLTarget, LlavaOnevisionTarget
from specmm.vlm.pipeline import SpeculativeVLM, VLMGenerationResult, with_image_token
from specmm.vlm.caption import caption_images, caption_prompt, find_images
from specmm.vlm.compressors import AttentionTopK, Bypass, Drop, Identity, LatentQueryPooling, LearnedQueryPooling
from specmm.vlm.drafter import METHODS, VisionDrafter
from specmm.vlm.train import DrafterTrainConfig, train_drafter

__all__ = [
    "METHODS", "AttentionTopK", "Bypass", "DrafterTrainConfig", "Drop", "Gemma3Target", "Identity", "Idefics3Target",
    "InternVLTarget", "LatentQueryPooling", "LearnedQueryPooling", "LlavaOnevisionTarget", "LlavaTarget",
    "Qwen2_5_VLTarget", "SpeculativeVLM", "VLMGenerationResult", "VLMTarget", "VisionDrafter", "caption_images",
    "caption_prompt",
    "find_images", "is_vision_language_model", "train_drafter", "vlm_target", "with_image_token",
]
