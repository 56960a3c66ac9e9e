"""Job manifests: a fresh output starts, the same job resumes, a different job is refused naming what differs,
--force starts over, and a second concurrent run is refused."""

from __future__ import annotations

import json

import pytest

from specmm.jobs import Job, JobLockedError, pending_batches

SETTINGS = {"method": "sjd", "seed": 0, "sampling": {"temperature": 1.0}, "target": "sha256:abc"}


def test_file_job_lifecycle(tmp_path):
    out = tmp_path / "out.jsonl"
    with Job(out, "caption", SETTINGS) as job:
        assert not job.resumed
        out.write_text('{"image": "a"}\n')
    manifest = json.loads((tmp_path / "out.jsonl.job.json").read_text())
    assert manifest["job"] == "caption" and manifest["settings"] == SETTINGS
    with pytest.raises(ValueError, match=r"--out: .*out.jsonl already holds results; pass --resume .* --force"):
        Job(out, "caption", SETTINGS).__enter__()
    with Job(out, "caption", {**SETTINGS}, resume=True) as job:
        assert job.resumed
    changed = {**SETTINGS, "seed": 5, "sampling": {"temperature": 0.5}}
    with pytest.raises(ValueError, match=r'holds a different job \(sampling: {"temperature": 1.0} -> '
                                         r'{"temperature": 0.5}; seed: 0 -> 5\)'):
        Job(out, "caption", changed, resume=True).__enter__()
    with pytest.raises(ValueError, match=r'job: "caption" -> "reason"'):
        Job(out, "reason", SETTINGS, resume=True).__enter__()
    with Job(out, "caption", changed, force=True) as job:
        assert not job.resumed and not out.exists()
    assert json.loads((tmp_path / "out.jsonl.job.json").read_text())["settings"]["seed"] == 5


def test_results_without_a_manifest_are_not_resumed(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"image": "a"}\n')
    with pytest.raises(ValueError, match="no readable job manifest .* pass --force"):
        Job(out, "caption", SETTINGS, resume=True).__enter__()
    with pytest.raises(ValueError, match="force=True"):  # library callers are told their keyword
        Job(out, "caption", SETTINGS, resume=True, argument="out_path").__enter__()


def test_folder_job_owns_only_its_files(tmp_path):
    out = tmp_path / "images"
    with Job(out, "sample-images", SETTINGS, folder=True, owned=("class*.png",)):
        (out / "class0000_000.png").write_bytes(b"png")
        (out / "notes.txt").write_text("the user's")
    with Job(out, "sample-images", SETTINGS, folder=True, owned=("class*.png",), force=True):
        assert not (out / "class0000_000.png").exists() and (out / "notes.txt").exists()


def test_a_second_concurrent_run_is_refused_and_the_first_keeps_its_output(tmp_path):
    out = tmp_path / "out.jsonl"
    with Job(out, "caption", SETTINGS):
        with pytest.raises(JobLockedError, match="PID"):
            Job(out, "caption", SETTINGS, resume=True).__enter__()
    with Job(out, "caption", SETTINGS, resume=True):  # released when the first run ends
        pass


def test_pending_batches_are_fixed_slices_of_the_job():
    items = list(range(7))
    assert pending_batches(items, 3, lambda i: False) == [[0, 1, 2], [3, 4, 5], [6]]
    assert pending_batches(items, 3, lambda i: i in {0, 1, 2, 3, 6}) == [[3, 4, 5]]  # not [[4, 5]]
    with pytest.raises(ValueError, match="batch_size: expected an integer >= 1, got 0"):
        pending_batches(items, 0, lambda i: False)


def test_part_files_of_a_killed_run_are_results_of_its_job(tmp_path):
    """A killed multi-process run leaves only `.out.part<rank>` files: another job may not merge them, --force
    deletes them, and only the same job resumes (and merges) them."""
    from specmm.jobs import check_file_output
    from specmm.jobs.shards import Processes, ShardedJournal, part_path

    out = tmp_path / "out.jsonl"
    with Job(out, "caption", SETTINGS):
        part_path(out, 1).write_text('{"image": "b", "caption": "old"}\n')  # the killed run's rank 1
    with pytest.raises(ValueError, match="part files of an interrupted multi-process run"):
        check_file_output(out, resume=False, force=False)
    with pytest.raises(ValueError, match="already holds results"):
        Job(out, "caption", {**SETTINGS, "seed": 1}).__enter__()
    with pytest.raises(ValueError, match="holds a different job .*seed: 0 -> 1"):
        Job(out, "caption", {**SETTINGS, "seed": 1}, resume=True).__enter__()
    assert part_path(out, 1).exists() and not out.exists()
    with ShardedJournal(Job(out, "caption", SETTINGS, resume=True), "image", Processes()) as journal:
        assert journal.done_keys == {"b"}  # the same job: merged into the output before anything new
    assert out.read_text() == '{"image": "b", "caption": "old"}\n' and not part_path(out, 1).exists()
    part_path(out, 0).write_text('{"image": "c"}\n')
    with ShardedJournal(Job(out, "caption", {**SETTINGS, "seed": 1}, force=True), "image", Processes()) as journal:
        assert journal.done_keys == set()
    assert not out.exists() and not part_path(out, 0).exists()


def test_two_spellings_of_one_output_share_its_lock_and_manifest(tmp_path):
    real = tmp_path / "real.jsonl"
    (tmp_path / "link.jsonl").symlink_to(real)
    (tmp_path / "alias").symlink_to(tmp_path)
    with Job(real, "caption", SETTINGS):
        for other in (tmp_path / "link.jsonl", tmp_path / "alias" / "real.jsonl"):
            with pytest.raises(JobLockedError, match=f"--out: {other} is being written"):
                Job(other, "caption", SETTINGS).__enter__()
        real.write_text('{"image": "a"}\n')
    with pytest.raises(ValueError, match="holds a different job .*seed: 0 -> 1"):  # the real file's manifest
        Job(tmp_path / "link.jsonl", "caption", {**SETTINGS, "seed": 1}, resume=True).__enter__()


def test_an_output_under_a_file_is_refused_before_work(tmp_path):
    from specmm.jobs import check_file_output

    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"--out: .*file/sub/out.jsonl cannot be written: .*file is a file"):
        check_file_output(tmp_path / "file" / "sub" / "out.jsonl", resume=False, force=True)
    with pytest.raises(ValueError, match="is a folder, expected a file"):
        check_file_output(tmp_path, resume=True, force=False)
