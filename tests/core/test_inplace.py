"""Slot writes into persistent buffers: scatter semantics, overlaps read before written, and compiled code that
writes in place (no pass over the whole buffer)."""

import torch
from torch._inductor.utils import run_and_get_code

from specmm.core.inplace import move_slots_, read_slots, write_columns_, write_slots_


def reference_move(buffer, source, target):
    out = buffer.clone()
    for b in range(buffer.shape[0]):
        for j in range(source.shape[1]):
            out[b, :, target[b, j]] = buffer[b, :, source[b, j]]
    return out


def test_write_and_read_slots_address_each_rows_own_slots():
    buffer = torch.zeros(2, 3, 6, 4)
    slots = torch.tensor([[1, 4], [0, 5]])
    values = torch.arange(2 * 3 * 2 * 4, dtype=torch.float).view(2, 3, 2, 4)
    write_slots_(buffer, slots, values)
    assert torch.equal(buffer[0, :, 1], values[0, :, 0]) and torch.equal(buffer[0, :, 4], values[0, :, 1])
    assert torch.equal(buffer[1, :, 0], values[1, :, 0]) and torch.equal(buffer[1, :, 5], values[1, :, 1])
    assert buffer[0, :, [0, 2, 3, 5]].abs().sum() == 0 and buffer[1, :, 1:5].abs().sum() == 0
    assert torch.equal(read_slots(buffer, slots), values)


def test_move_slots_reads_every_source_before_writing_overlapping_targets():
    buffer = torch.randn(2, 2, 10, 3)
    source = torch.tensor([[5, 7, 8], [2, 3, 4]])  # row 0: two slots stay where they are
    target = torch.tensor([[6, 7, 8], [1, 2, 3]])  # row 1: each target after the first is an earlier source
    expected = reference_move(buffer, source, target)
    move_slots_(buffer, source, target)
    assert torch.equal(buffer, expected)


def test_write_columns_sets_each_rows_columns():
    history = torch.zeros(2, 5, dtype=torch.long)
    write_columns_(history, torch.tensor([[0, 1], [3, 4]]), torch.tensor([[7, 8], [9, 10]]))
    assert history.tolist() == [[7, 8, 0, 0, 0], [0, 0, 0, 9, 10]]


def test_compiled_move_slots_matches_eager_and_never_copies_the_whole_buffer():
    torch._dynamo.reset()
    buffer = torch.randn(1, 3, 1000, 16)  # 48000 elements: a C++ loop over all of them would be bounded by 48000L
    source, target = torch.tensor([[700, 702, 703]]), torch.tensor([[400, 401, 402]])
    expected = reference_move(buffer, source, target)
    _, codes = run_and_get_code(torch.compile(move_slots_, fullgraph=True), buffer, source, target)
    assert torch.equal(buffer, expected)
    assert not any("48000L" in code for code in codes), "the compiled write copies the whole buffer"
