"""`DrawTape`: a round's draws recorded once, then made up front from the same generators in the same order and
read back by the round; the per-row draws it replays are those eager mode makes."""

from __future__ import annotations

import pytest
import torch

from specmm.core.compiled import taped_rounds
from specmm.core.draws import DrawTape, draw
from specmm.core.sampling import exponential, uniform

CPU = torch.device("cpu")


def a_round(generators) -> list[torch.Tensor]:
    """The draws of a sampled chain round of depth 2 over a vocabulary of 5: two draft samples, coins, residual."""
    return [exponential(3, (5,), generators, CPU), exponential(3, (5,), generators, CPU),
            uniform(3, (2, 1), generators, CPU), exponential(3, (5,), generators, CPU)]


def seeded() -> list[torch.Generator]:
    return [torch.Generator().manual_seed(40 + row) for row in range(3)]


def test_rounds_read_from_a_tape_are_the_rounds_eager_mode_draws():
    eager_gens, taped_gens = seeded(), seeded()
    eager = [a_round(eager_gens) for _ in range(4)]
    tape = DrawTape(taped_gens, CPU)
    taped = [a_round(tape)]  # recording: drawn as they are asked for
    for _ in range(3):
        tape.refill()
        taped.append([d.clone() for d in a_round(tape)])  # views of the tape's buffer, valid until a refill
        tape.finish()
    assert tape.entries == [("exponential", 3, (5,)), ("exponential", 3, (5,)), ("uniform", 3, (2, 1)),
                            ("exponential", 3, (5,))]
    for eager_round, taped_round in zip(eager, taped):
        for expected, got in zip(eager_round, taped_round):
            assert torch.equal(got, expected)


def test_each_row_draws_from_its_own_generator():
    """Row 1's draws do not depend on the other rows' generators."""
    gens = seeded()
    alone = draw("uniform", 1, (4,), [torch.Generator().manual_seed(41)], CPU)
    assert torch.equal(draw("uniform", 3, (4,), gens, CPU)[1], alone[0])


def test_a_round_that_asks_for_other_draws_than_recorded_is_refused():
    tape = DrawTape(seeded(), CPU)
    a_round(tape)
    tape.refill()
    exponential(3, (5,), tape, CPU)
    with pytest.raises(RuntimeError, match="asked for uniform"):
        uniform(3, (7,), tape, CPU)
    tape.refill()
    exponential(3, (5,), tape, CPU)
    with pytest.raises(RuntimeError, match="took 1 of the 4"):
        tape.finish()


def test_per_row_generators_must_match_the_batch():
    with pytest.raises(ValueError, match="expected 3 per-row generators, got 2"):
        draw("exponential", 3, (5,), seeded()[:2], CPU)


def first_differs(generators, round_index: int) -> list[torch.Tensor]:
    """Like a Jacobi window: the first round draws fresh tokens (uniform), later rounds noise (exponential)."""
    return [uniform(3, (4,), generators, CPU)] if round_index == 0 else a_round(generators)


@pytest.mark.parametrize("make_round, expected_calls", [
    (lambda generators, index: a_round(generators),
     [["part", "part", "whole", "whole"], ["part", "whole", "whole", "whole"]]),
    (first_differs, [["part", "part", "whole", "whole"], ["part", "part", "whole", "whole"]]),
])
def test_taped_rounds_run_whole_from_the_second_round_once_the_first_is_known_to_repeat(make_round, expected_calls):
    """Generation 1 learns whether a first round draws as the second; generation 2 then runs whole from round 2.
    Every round sees exactly the draws eager mode makes from the same seeds."""
    repeating: set[tuple] = set()
    for generation, expected in enumerate(expected_calls):
        calls, seen, index = [], [], {"round": 0}

        def runner(name):
            def run(roots, sampling, generators):
                calls.append(name)
                seen.append([d.clone() for d in make_round(generators, index["round"])])
                index["round"] += 1
            return run

        step = taped_rounds(runner("part"), runner("whole"), CPU, repeating, key=("drafter",))
        generators = seeded()
        for _ in range(4):
            step(None, None, generators)
        assert calls == expected, generation
        eager_gens = seeded()
        for round_index, taped_round in enumerate(seen):
            for expected_draw, got in zip(make_round(eager_gens, round_index), taped_round):
                assert torch.equal(got, expected_draw)
    assert len(repeating) == (make_round is not first_differs)
