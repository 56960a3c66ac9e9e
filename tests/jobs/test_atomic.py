"""Atomic writes: the destination holds the old content or the whole new one, never a torn file or a temporary."""

from __future__ import annotations

import pytest
from PIL import Image

from specmm.jobs import atomic_save_image, atomic_write_json, atomic_write_text, atomic_writer, remove_temporaries


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_writer(path, "w") as f:
        f.write("half of the new con")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    atomic_write_json(path, {"new": 1})
    assert path.read_text() == '{\n "new": 1\n}\n'


def test_images_are_saved_whole_and_temporaries_of_killed_writes_are_cleared(tmp_path):
    path = tmp_path / "class0001_000.png"
    atomic_save_image(Image.new("RGB", (4, 4), "red"), path)
    with Image.open(path) as image:
        assert image.getpixel((0, 0)) == (255, 0, 0)
    (tmp_path / ".class0001_001.png.123.tmp").write_bytes(b"\x89PNG half")  # left by a SIGKILLed writer
    (tmp_path / ".other.json.9.tmp").write_text("{")
    assert [p.name for p in remove_temporaries(tmp_path, "class")] == [".class0001_001.png.123.tmp"]
    assert [p.name for p in remove_temporaries(tmp_path)] == [".other.json.9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class0001_000.png"]
