"""The draft-verify engine every modality shares."""

from specmm.core.acceptance import (
    EXACT,
    AcceptanceRule,
    AcceptResult,
    ExactRule,
    accept,
    accept_greedy,
    accept_sampled,
    check_rule,
)
from specmm.core.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from specmm.core.draft_distill import DistillConfig, distill_draft
from specmm.core.eagle import EagleDrafter, EagleHead
from specmm.core.eagle_train import EagleTrainConfig, train_eagle
from specmm.core.engine import (
    EosCriterion,
    GenerationOutput,
    GenerationStats,
    RoundOutput,
    SpeculativeGenerator,
    StoppingCriterion,
)
from specmm.core.sampling import SamplingConfig, process_logits
from specmm.core.stats import (
    CaptionExtras, ContinuousExtras, DiffusionExtras, ImageExtras, ReasoningExtras,
)
from specmm.core.target import HFCausalLMTarget, Target, TargetOutput, as_target, register_target_adapter
from specmm.core.tree import DraftTree, TreeSpec, grow_tree

__all__ = [
    "EXACT", "AcceptanceRule", "AcceptResult", "ExactRule", "accept", "accept_greedy", "accept_sampled", "check_rule",
    "Drafter", "ModelDrafter", "PromptLookupDrafter", "EagleDrafter", "EagleHead", "EagleTrainConfig", "train_eagle",
    "DistillConfig", "distill_draft",
    "EosCriterion", "RoundOutput", "StoppingCriterion", "GenerationOutput", "GenerationStats",
    "CaptionExtras", "ContinuousExtras", "DiffusionExtras", "ImageExtras",
    "ReasoningExtras", "SpeculativeGenerator", "SamplingConfig", "process_logits",
    "HFCausalLMTarget", "Target", "TargetOutput", "as_target", "register_target_adapter",
    "DraftTree", "TreeSpec", "grow_tree",
]
