"""STree: tree speculative decoding for Mamba2 and hybrid SSM/attention models (stock HF classes).

Importing this package registers the SSM target adapter, so `SpeculativeGenerator(target=mamba2_model, ...)`
picks it up for `Mamba2ForCausalLM`, `BambaForCausalLM`, `NemotronHForCausalLM`, `Zamba2ForCausalLM`,
`FalconH1ForCausalLM` and `GraniteMoeHybridForCausalLM`, in eager and in the fast mode (`compile=True`: each round,
the verify and the state commit of `specmm.ssm.steps` included, runs as one compiled graph).
"""

from specmm.core.target import register_target_adapter
from specmm.ssm.target import SUPPORTED_MODELS, SSMTarget, build_target, is_ssm_model
from specmm.ssm.tree_scan import (
           TreeLayout,
           TreeRecord,
           commit_state,
           replay_state,
           tree_mixer_forward,
)

register_target_adapter(is_ssm_model, build_target)

__all__ = ["SUPPORTED_MODELS", "SSMTarget", "TreeLayout", "TreeRecord", "commit_state", "replay_state",
           "tree_mixer_forward"]
