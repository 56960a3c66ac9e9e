"""specmm: speculative decoding for models that are not plain text LLMs, on stock Hugging Face models."""

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
from specmm import ssm  # noqa: E402,F401  registers the Mamba2 / hybrid target adapter

__version__ = "0.1.0"
__all__ = [
    "AcceptanceRule", "DraftTree", "GenerationOutput", "GenerationStats", "SamplingConfig",
    "SpeculativeGenerator", "TreeSpec", "drafters",
]
