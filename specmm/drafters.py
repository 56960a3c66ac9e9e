"""Public drafter namespace: `specmm.drafters.ModelDrafter`, `PromptLookupDrafter`, `EagleDrafter`."""

from specmm.core.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from specmm.core.eagle import EagleDrafter, EagleHead

__all__ = ["Drafter", "ModelDrafter", "PromptLookupDrafter", "EagleDrafter", "EagleHead"]
