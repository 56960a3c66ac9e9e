"""Named methods (`specmm.image_ar.methods`): each builds the proposer and rule it names."""

import pytest
import torch

from specmm.core.tree import TreeSpec
from specmm.image_ar import GSD, ImageDrafter, ImageSampler
from specmm.image_ar.jacobi import JacobiProposer
from specmm.image_ar.methods import NEEDS_DRAFTER, make_sampler

CONDITIONS = torch.tensor([1, 3, 5])


def test_gsd_runs_jacobi_windows_and_gsd_drafter_runs_the_drafter(lg):
    drafter = ImageDrafter.for_target(lg.gpt)
    jacobi = make_sampler(lg, "gsd", drafter, window=6, gsd_window=8)
    drafted = make_sampler(lg, "gsd-drafter", drafter, tree=TreeSpec.chain(3), gsd_window=8)
    assert isinstance(jacobi.proposer, JacobiProposer) and jacobi.tree.depth == 5
    assert drafted.proposer is drafter and drafted.tree.depth == 3
    assert isinstance(jacobi.rule, GSD) and isinstance(drafted.rule, GSD) and drafted.rule.window == 8


def test_gsd_drafter_with_singleton_groups_is_exact(lg):
    """Window 1 makes GSD the exact rule: greedy tokens over the drafter's chain equal greedy AR's."""
    sampler = make_sampler(lg, "gsd-drafter", ImageDrafter.for_target(lg.gpt), tree=TreeSpec.chain(3), gsd_window=1)
    out = sampler.sample(CONDITIONS, cfg_scale=3.0, temperature=0.0, decode=False)
    ar = ImageSampler(lg, proposer="ar").sample(CONDITIONS, cfg_scale=3.0, temperature=0.0, decode=False)
    assert torch.equal(out.tokens, ar.tokens) and out.stats.moved_mass == 0.0


@pytest.mark.parametrize("method", NEEDS_DRAFTER)
def test_drafter_methods_refuse_to_run_without_one(lg, method):
    with pytest.raises(ValueError, match="needs a trained image drafter"):
        make_sampler(lg, method)


def test_sample_images_offers_every_named_method():
    """The CLI lists the methods literally (its parser loads no model code): the list must stay `METHODS`."""
    import argparse

    from specmm.cli.images import add_parser
    from specmm.image_ar.methods import METHODS

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    method = next(a for a in sub.choices["sample-images"]._actions if a.dest == "method")
    assert tuple(method.choices) == METHODS
