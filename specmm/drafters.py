"""Public drafter namespace: `specmm.drafters.ModelDrafter`, `PromptLookupDrafter`, `EagleDrafter`, and
`distill_draft` (align a small LM with its target before drafting with it)."""

from specmm.core.draft_distill import DistillConfig, distill_draft
from specmm.core.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from specmm.core.eagle import EagleDrafter, EagleHead

__all__ = ["Drafter", "ModelDrafter", "PromptLookupDrafter", "EagleDrafter", "EagleHead", "DistillConfig",
           "distill_draft"]
