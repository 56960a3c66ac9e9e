"""Item keys ignore how a path is spelled; model fingerprints follow content, not location."""

from __future__ import annotations

import json
import os
import struct

from specmm.jobs import file_key, fingerprint, text_key
from specmm.jobs import content as fingerprint_module


def test_file_keys_are_the_same_for_every_spelling_of_a_path(tmp_path, monkeypatch):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(b"x")
    os.symlink(tmp_path / "imgs", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    spellings = ["imgs/a.png", "./imgs/a.png", str(tmp_path / "imgs" / "a.png"), "imgs/../imgs/a.png", "link/a.png"]
    assert len({file_key(s) for s in spellings}) == 1
    monkeypatch.chdir(tmp_path / "imgs")
    assert file_key("a.png") == file_key(spellings[2]) == str((tmp_path / "imgs" / "a.png").resolve())


def test_text_keys_hash_the_prompt_text():
    assert text_key("2+2?") == text_key("2+2?") != text_key("2+2? ")
    assert len(text_key("x" * 100_000)) == 32


def test_fingerprints_follow_content_and_ignore_location_and_hidden_files(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"weights-1")
    first = fingerprint(model)
    (model / ".model.safetensors.12.tmp").write_bytes(b"junk")  # temporaries and locks are not content
    (model / ".job.lock").write_text("123")
    assert fingerprint(model) == first
    moved = tmp_path / "moved"
    model.rename(moved)
    assert fingerprint(moved) == first
    (moved / "model.safetensors").write_bytes(b"weights-2")  # retrained in place
    assert fingerprint(moved) != first
    assert fingerprint(moved / "config.json").startswith("sha256:")


def test_large_files_are_hashed_by_header_size_and_sampled_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint_module, "FULL_HASH_BYTES", 1 << 10)
    monkeypatch.setattr(fingerprint_module, "SAMPLE_BYTES", 64)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}).encode()
    data = bytearray(struct.pack("<Q", len(header)) + header + bytes(4096))
    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(data))
    base = fingerprint(path)
    data[-1] ^= 1  # the last sampled block covers the file's end
    path.write_bytes(bytes(data))
    assert fingerprint(path) != base
    data[-1] ^= 1
    data[20] ^= 1  # inside the header
    path.write_bytes(bytes(data))
    assert fingerprint(path) != base
    data[20] ^= 1
    path.write_bytes(bytes(data) + b"\0")  # the size
    assert fingerprint(path) != base
