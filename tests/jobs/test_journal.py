"""Keyed JSON-lines results: whole lines, a torn last line repaired, a damaged middle line refused."""

from __future__ import annotations

import json

import pytest

from specmm.jobs import Journal


def test_appended_records_are_whole_lines_and_reload_by_key(tmp_path):
    path = tmp_path / "out.jsonl"
    with Journal(path) as journal:
        journal.append([{"key": "a", "v": 1}, {"key": "b", "v": "é"}])
        journal.append([])
        journal.append([{"key": "c", "v": 3}])
    assert path.read_bytes().count(b"\n") == 3 and path.read_bytes().endswith(b"\n")
    assert Journal(path).load() == {"a": {"key": "a", "v": 1}, "b": {"key": "b", "v": "é"}, "c": {"key": "c", "v": 3}}


def test_a_torn_last_line_is_cut_off_and_its_item_redone(tmp_path):
    path = tmp_path / "out.jsonl"
    whole = json.dumps({"key": "a"}) + "\n"
    path.write_text(whole + '{"key": "b", "capt')  # a kill in the middle of a write
    assert list(Journal(path).load()) == ["a"]
    assert path.read_text() == whole  # repaired on disk: the next append starts on a fresh line
    with Journal(path) as journal:
        journal.append([{"key": "b"}])
    assert list(Journal(path).load()) == ["a", "b"]


def test_a_damaged_middle_line_is_refused_naming_it(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"key": "a"}\nnot json\n{"key": "c"}\n')
    with pytest.raises(ValueError, match=r"--out: line 2 of .*out.jsonl is not a result record"):
        Journal(path).load()
    path.write_text('{"key": "a"}\n{"other": 1}\n')
    with pytest.raises(ValueError, match=r"line 2 .* \(no 'key'\)"):
        Journal(path).load()


def test_rewrite_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "out.jsonl"
    with Journal(path) as journal:
        journal.append([{"key": "b"}, {"key": "a"}])
        journal.rewrite([{"key": "a"}, {"key": "b"}])
    assert list(Journal(path).load()) == ["a", "b"] and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
