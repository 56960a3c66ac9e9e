"""specmm: speculative decoding for models that are not plain text LLMs, on stock Hugging Face models."""

from typing import TYPE_CHECKING

from specmm import drafters
from specmm.core import (
    AcceptanceRule,
    DraftTree,
    GenerationOutput,
    GenerationStats,
    SamplingConfig,
    SpeculativeGenerator,
    TreeSpec,
)
from specmm.modalities import MODALITIES, load, register_lazy_adapters

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the packages load on first attribute access
    from specmm import diffusion_lm, image_ar, reasoning, ssm, vlm  # noqa: F401

register_lazy_adapters()  # Mamba2 / hybrid and VLM targets are recognised before their packages are imported


def __getattr__(name: str):
    """`specmm.vlm`, `specmm.image_ar`, `specmm.ssm`, `specmm.diffusion_lm`, `specmm.reasoning` (PEP 562)."""
    return load(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MODALITIES))


__version__ = "0.1.0"
__all__ = [
    "AcceptanceRule", "DraftTree", "GenerationOutput", "GenerationStats", "SamplingConfig",
    "SpeculativeGenerator", "TreeSpec", "drafters",
]
