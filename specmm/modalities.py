"""The modality packages `import specmm` reaches lazily, and their target adapters registered before any is imported.

`specmm.core` imports no modality package, and importing every modality with `specmm` would cost seconds, so
this module (above core, below nothing) registers a cheap matcher per adapter: it looks only at the model's
class name or config, exactly as the package's own matcher does, and imports the package on the first match.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from specmm.core.target import Target, register_target_adapter

MODALITIES = ("vlm", "image_ar", "ssm", "diffusion_lm", "reasoning")

# Same names as `specmm.ssm.target.SUPPORTED_MODELS + STATEFUL_MODELS` (a test keeps them equal): supported
# Mamba2/hybrid classes get the SSM adapter, other stateful ones its clear error instead of the text adapter.
SSM_MODEL_CLASSES = frozenset({
    "Mamba2ForCausalLM", "BambaForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM", "FalconH1ForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "MambaForCausalLM", "FalconMambaForCausalLM", "JambaForCausalLM", "ZambaForCausalLM", "Qwen3NextForCausalLM",
})


def is_ssm_model(model: Any) -> bool:
    """Cheap twin of `specmm.ssm.target.is_ssm_model` (by class name)."""
    return isinstance(model, nn.Module) and type(model).__name__ in SSM_MODEL_CLASSES


def has_vision_tower(model: Any) -> bool:
    """Cheap twin of `specmm.vlm.targets.is_vision_language_model` (a config with a vision tower)."""
    return isinstance(model, nn.Module) and getattr(getattr(model, "config", None), "vision_config", None) is not None


@dataclass(frozen=True)
class LazyAdapter:
    """A target adapter of `module` (`module.matcher` decides, `module.builder` builds) matched by `matches`."""

    module: str
    matcher: str
    builder: str
    matches: Callable[[Any], bool]

    def build(self, model: Any) -> Target:
        return getattr(importlib.import_module(self.module), self.builder)(model)


TARGET_ADAPTERS = (
    LazyAdapter("specmm.ssm.target", "is_ssm_model", "build_target", is_ssm_model),
    LazyAdapter("specmm.vlm.targets", "is_vision_language_model", "vlm_target", has_vision_tower),
)


def register_lazy_adapters() -> None:
    """Register every modality's target adapter with `specmm.core.as_target` without importing the modality.

    Importing a package registers its own adapter in front of these, so after the first match they only stand by.
    """
    for adapter in TARGET_ADAPTERS:
        register_target_adapter(adapter.matches, adapter.build)


def load(name: str):
    """Import the modality package `specmm.<name>`."""
    if name not in MODALITIES:
        raise AttributeError(f"module 'specmm' has no attribute {name!r}")
    return importlib.import_module(f"specmm.{name}")


__all__ = ["MODALITIES", "SSM_MODEL_CLASSES", "TARGET_ADAPTERS", "LazyAdapter", "has_vision_tower", "is_ssm_model",
           "load", "register_lazy_adapters"]
