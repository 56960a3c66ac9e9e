"""Continuous-token AR image models (MAR-style per-token denoising head) and CSpD, continuous speculative decoding."""

from specmm.image_ar.continuous.heads import DDPMHead, GaussianHead, compile_chain
from specmm.image_ar.continuous.model import ContinuousAR, ContinuousARConfig
from specmm.image_ar.continuous.rules import RULES, FinalStepRule, TrajectoryRule
from specmm.image_ar.continuous.sampler import (
           CSpDSampler,
           SampleOutput,
           sample_ar,
)

__all__ = ["RULES", "CSpDSampler", "ContinuousAR", "ContinuousARConfig", "DDPMHead", "FinalStepRule",
           "GaussianHead", "SampleOutput", "TrajectoryRule", "compile_chain", "sample_ar"]
