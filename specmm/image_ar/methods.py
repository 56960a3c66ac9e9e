"""Named methods -> ImageSampler: AR, exact SD, SJD, LANTERN, LANTERN++, GSD over Jacobi windows (the paper's setting)
and GSD over the image drafter (as the CLI and bench name them)."""

from __future__ import annotations

from specmm.core.tree import TreeSpec
from specmm.image_ar.acceptance import GSD, SJD, Exact, Lantern, LanternPP
from specmm.image_ar.drafter import ImageDrafter
from specmm.image_ar.llamagen.model import LlamaGen
from specmm.image_ar.models import ImageModel, image_model_for
from specmm.image_ar.sampler import ImageSampler
from specmm.image_ar.trees import lantern_pp_tree

METHODS = ("ar", "exact", "sjd", "lantern", "lantern++", "gsd", "gsd-drafter")
NEEDS_DRAFTER = ("lantern", "lantern++", "gsd-drafter")


def make_sampler(lg: LlamaGen | ImageModel, method: str, drafter: ImageDrafter | None = None, *, window: int = 16,
                 init: str = "random", tree: TreeSpec | None = None, lantern_k: int = 1000, delta: float = 0.1,
                 lam: float = 5.0, lantern_pp_k: int = 10, gsd_window: int = 14, gsd_p_gap: float = 0.15,
                 gsd_quantile: float = 0.05,
                 cfg_interval: int = -1, compile: bool = False) -> ImageSampler:
    """exact uses the drafter when given (else Jacobi); sjd and gsd use Jacobi; lantern(++) and gsd-drafter (GSD's
    grouped rule over the drafter's proposals) need a drafter.
    `lg`: a LlamaGen or an `ImageModel` (stock generators: `image_model_for(model, processor)`).
    `compile=True`: the compiled fast path (`ImageSampler(compile=True)`)."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if method in NEEDS_DRAFTER and drafter is None:
        raise ValueError(f"drafter: method {method!r} needs a trained image drafter (--drafter DIR)")
    common = {"window": window, "init": init, "cfg_interval": cfg_interval, "compile": compile}
    codes = image_model_for(lg).target.vocab_size
    if method == "ar":
        return ImageSampler(lg, proposer="ar", cfg_interval=cfg_interval, compile=compile)
    if method == "exact":
        return ImageSampler(lg, proposer=drafter or "jacobi", acceptance=Exact(), tree=tree if drafter else None,
                            **common)
    if method == "sjd":
        return ImageSampler(lg, proposer="jacobi", acceptance=SJD(), **common)
    if method in ("gsd", "gsd-drafter"):
        rule = GSD(window=gsd_window, p_gap=gsd_p_gap, quantile=gsd_quantile)
        if method == "gsd":
            return ImageSampler(lg, proposer="jacobi", acceptance=rule, **common)
        return ImageSampler(lg, proposer=drafter, acceptance=rule, tree=tree, **common)
    if method == "lantern":
        return ImageSampler(lg, proposer=drafter, acceptance=Lantern(k=min(lantern_k, codes - 1), delta=delta),
                            tree=tree, **common)
    return ImageSampler(lg, proposer=drafter, acceptance=LanternPP(k=min(lantern_pp_k, codes - 1), lam=lam),
                        tree=tree or lantern_pp_tree(), **common)
