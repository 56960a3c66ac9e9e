"""`DrawTape`: a round's draws recorded once, then made up front from the same generators in the same order and
read back by the round; the per-row draws it replays are those eager mode makes."""

from __future__ import annotations

import pytest
import torch

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
