"""One verification step on a toy vocabulary: the output distribution of each rule, measured empirically.

exact / SJD reproduce p (chi-square); LANTERN's output is its relaxed p' with TV(p, p') <= delta; LANTERN++
keeps p_out(x) <= lambda p(x); GSD with singleton groups reproduces p.
"""

import pytest
import torch
from scipy.stats import chisquare

from specmm.core.acceptance import accept_sampled
from specmm.core.tree import DraftTree
from specmm.image_ar import GSD, SJD, Exact, Lantern, LanternPP, codebook_neighbours

V, N = 10, 40_000


def _distributions(seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    codebook = torch.randn(V, 4, generator=g)
    return p, q, codebook


def _one_step(rule, p: torch.Tensor, q: torch.Tensor | None, draft: int | None, seed: int) -> torch.Tensor:
    """Empirical distribution [V] of the token committed at depth 1 over N independent rows."""
    g = torch.Generator().manual_seed(seed)
    if draft is None:  # drafts sampled from q
        tokens = torch.multinomial(q.float(), N, replacement=True, generator=g)
    else:
        tokens = torch.full((N,), draft)
    draft_probs = None
    if q is not None:
        draft_probs = torch.stack([torch.zeros_like(q), q]).expand(N, 2, V)
    tree = DraftTree(tokens=torch.stack([torch.zeros(N, dtype=torch.long), tokens], 1),
                     parents=torch.tensor([-1, 0]).expand(N, 2), depth=torch.tensor([0, 1]).expand(N, 2),
                     valid=torch.ones(N, 2, dtype=torch.bool), max_depth=1, max_children=1, draft_probs=draft_probs)
    result = accept_sampled(tree, p.expand(N, 2, V).clone(), rule, g)
    out = torch.where(result.num_accepted == 1, tokens, result.next_token)
    return torch.bincount(out, minlength=V).double() / N


def _assert_matches(empirical: torch.Tensor, expected: torch.Tensor) -> None:
    keep = expected * N >= 5
    observed, wanted = empirical[keep] * N, expected[keep] * N
    wanted = wanted * observed.sum() / wanted.sum()
    assert chisquare(observed.numpy(), wanted.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("rule", [Exact(), SJD()], ids=["exact", "sjd"])
@pytest.mark.parametrize("mode", ["sampled-draft", "point-mass"])
def test_exact_and_sjd_reproduce_target_distribution(rule, mode):
    p, q, _ = _distributions(1)
    if mode == "sampled-draft":  # a recycled Jacobi draft: drawn from the stale distribution it keeps
        empirical = _one_step(rule, p, q, None, 2)
    else:  # a freshly initialised token
        empirical = _one_step(rule, p, None, 3, 2)
    _assert_matches(empirical, p)


@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5])
@pytest.mark.parametrize("rank", [0, 5, 9])
def test_lantern_output_within_tv_delta(delta, rank):
    """Deterministic (point-mass) drafts, LANTERN's setting: the output is exactly p', TV(p, p') <= delta."""
    p, _, codebook = _distributions(4)
    rule = Lantern(k=4, delta=delta, neighbours=codebook_neighbours(codebook, 4))
    draft = int(p.argsort(descending=True)[rank])
    empirical = _one_step(rule, p, None, draft, 5)
    assert 0.5 * (empirical - p).abs().sum() <= delta + 0.01
    relaxed = rule.relaxed(p[None], torch.tensor([draft]))[0]
    assert 0.5 * (relaxed - p).abs().sum() <= delta + 1e-12
    _assert_matches(empirical, relaxed)


def test_lantern_delta_zero_is_exact():
    p, q, codebook = _distributions(6)
    rule = Lantern(k=4, delta=0.0, neighbours=codebook_neighbours(codebook, 4))
    _assert_matches(_one_step(rule, p, q, None, 7), p)


@pytest.mark.parametrize("lam", [2.0, 5.0])
def test_lantern_pp_bounds_draft_probability_by_lambda(lam):
    p, _, codebook = _distributions(8)
    rule = LanternPP(k=6, lam=lam, neighbours=codebook_neighbours(codebook, 6))
    draft = int(p.argsort()[V // 2])
    empirical = _one_step(rule, p, None, draft, 9)
    assert empirical[draft] <= lam * p[draft] + 0.01
    assert empirical[draft] > p[draft] + 0.01 or rule.moved_mass(p[None], torch.tensor([draft]))[0] == 0


def test_gsd_singleton_groups_reproduce_target_and_groups_relax():
    p, q, _codebook = _distributions(10)
    _assert_matches(_one_step(GSD(window=1), p, q, None, 11), p)
    wide = GSD(window=2 * V, p_gap=1.0)  # the window reaches every rank
    draft = torch.tensor([int(p.argmin())])
    assert wide.accept_probability(p[None], None, draft)[0] == pytest.approx(1.0)
    assert GSD(window=1).accept_probability(p[None], None, draft)[0] == pytest.approx(float(p.min()))


def test_gsd_calibrated_distance_filters_group():
    p, _, codebook = _distributions(12)
    rule = GSD(window=V, p_gap=1.0).bind(codebook, quantile=0.0)  # d_max below every distance: singletons
    draft = torch.tensor([3])
    group = rule.group(p[None], draft)[0]
    assert group.sum() == 1 and group[3]


def test_gsd_distance_bound_grows_with_its_calibration_quantile():
    codebook = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    tight, loose = GSD(quantile=0.05).bind(codebook), GSD(quantile=0.5).bind(codebook)
    assert 0 < tight.d_max < loose.d_max


def test_gsd_group_is_the_rank_window_of_the_stable_descending_order_ties_included():
    """The group is the window around x's place in the target's stable descending order (ties by token id)."""
    probs = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.05, 0.15], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]])
    rule = GSD(window=3, p_gap=1.0)
    for row in range(2):
        order = torch.argsort(probs[row], descending=True, stable=True).tolist()
        for token in range(6):
            rank = order.index(token)
            expected = {order[i] for i in range(max(rank - 1, 0), min(rank + 2, 6))} | {token}
            group = rule.group(probs[row: row + 1], torch.tensor([token]))[0]
            assert set(group.nonzero()[:, 0].tolist()) == expected, (row, token)
