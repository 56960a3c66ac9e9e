"""Acceptance rules for image AR: exact, SJD, LANTERN, LANTERN++ and GSD (each reports what it relaxed)."""

from specmm.image_ar.acceptance.gsd import GSD, calibrate_distance
from specmm.image_ar.acceptance.lantern import Lantern, codebook_neighbours
from specmm.image_ar.acceptance.lantern_pp import LanternPP
from specmm.image_ar.acceptance.relaxed import RelaxedRule
from specmm.image_ar.acceptance.sjd import SJD, Exact

__all__ = ["GSD", "SJD", "Exact", "Lantern", "LanternPP", "RelaxedRule", "calibrate_distance",
           "codebook_neighbours"]
