"""Prefix cache: exact K/V reuse mechanics, and SSD exact against stepwise under the same cache mode."""

from __future__ import annotations

import pytest
import torch

from specmm.diffusion_lm import generate
from tests.diffusion_lm.conftest import MASK, tiny_dlm


def test_cached_window_forward_equals_the_full_forward_of_the_same_state():
    model = tiny_dlm(seed=1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 38, (3, 20), generator=gen)
    x[:, 12:] = MASK
    full, cache = model(x, return_cache=True)
    cache.lengths = torch.tensor([8, 12, 10])  # rows cache different prefix lengths
    window, _ = model(x[:, 8:], cache=cache, start=8, logits_from=8)
    assert torch.allclose(window, full[:, 8:], atol=1e-12, rtol=0)


def test_cached_forward_reads_the_cache_not_the_current_prefix():
    model = tiny_dlm(seed=2)
    x = torch.randint(0, 38, (1, 16), generator=torch.Generator().manual_seed(1))
    _, cache = model(x, return_cache=True)
    cache.lengths = torch.tensor([8])
    changed = x.clone()
    changed[0, :8] = (changed[0, :8] + 1) % 38  # the prefix changes, the cache does not
    with_cache, _ = model(changed[:, 8:], cache=cache, start=8, logits_from=8)
    assert torch.allclose(with_cache, model(x)[0][:, 8:], atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", range(6))
def test_ssd_with_prefix_cache_equals_stepwise_with_prefix_cache(seed):
    model = tiny_dlm(seed=seed, std=0.6)
    ids = torch.randint(0, 38, (2, 6), generator=torch.Generator().manual_seed(seed))
    ref = generate(model, ids, 24, 8, method="stepwise", cache="prefix")
    assert ref.stats.diffusion.full_forwards == 3 and ref.stats.target_forwards == 24  # one refresh per block
    for draft_size, tree_width in ((1, 1), (4, 1), (8, 2)):
        out = generate(model, ids, 24, 8, method="ssd", cache="prefix", draft_size=draft_size, tree_width=tree_width)
        assert torch.equal(out.sequences, ref.sequences)
        assert all(f <= 24 for f in out.stats.target_forwards_per_row)


def test_prefix_cache_is_an_approximation_of_uncached_decoding():
    differs = 0
    for seed in range(4):
        model = tiny_dlm(seed=seed, std=0.6)
        ids = torch.randint(0, 38, (1, 6), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, ids, 16, 4, method="stepwise").sequences
        cached = generate(model, ids, 16, 4, method="stepwise", cache="prefix").sequences
        differs += int(not torch.equal(plain, cached))
    assert differs > 0  # stale prefix K/V changes decisions; SSD must be compared under the same mode
