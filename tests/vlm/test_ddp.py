"""Data-parallel drafter training (`specmm.vlm.ddp`): `specmm train-drafter` on two CPU processes (gloo) trains the
drafter one process trains on the same global batches, and a run handed from one process to two (a stop, then a
resume) and back to one (a SIGKILL, then a resume) ends with the uninterrupted one-process run's drafter.

The two processes come from accelerate's test launcher (`debug_launcher`): forked from this one, so nothing is
imported again, and they run the same code as under `accelerate launch` (PartialState, Accelerator, DDP on gloo);
the launcher itself adds only interpreter start-up and rendezvous, which tests/jobs/test_shards.py covers."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from accelerate import debug_launcher
from safetensors.torch import load_file
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from specmm.cli import main
from specmm.core import eagle_train
from specmm.vlm import ddp
from specmm.vlm.ddp import BatchShard

# Two processes agree with one up to float32 rounding: a shard's matrix products run on 2 rows instead of 4, its
# loss is summed in two parts and DDP averages the two gradients (AdamW's steps are about lr whatever the gradient's
# size, so only the gradient's direction matters). Measured against what a 2-step stage moves the weights (the
# one-process multimodal stage), rounding leaves ~1e-4 of it; a per-process mean loss (each process's text slots
# weighed as a whole, not each slot equally) leaves ~4e-2, and noise drawn per process ~1. The bound: 1e-2.
SHARE_OF_A_STAGE = 1e-2


def train_args(out) -> list[str]:
    # 4 rows of captions of unequal lengths, 2 per process: a per-process mean would weigh them differently
    return ["train-drafter", "--scale", "tiny", "--method", "vispec", "--scenes", "4", "--text-steps", "2",
            "--multimodal-steps", "2", "--batch-size", "4", "--checkpoint-every", "1", "--device", "cpu",
            "--out", str(out)]


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_close(ours: dict, reference: dict, stage_move: float) -> None:
    assert ours.keys() == reference.keys()
    worst = max((ours[k] - reference[k]).abs().max().item() for k in ours)
    print(f"largest weight difference {worst:.2e}, {worst / stage_move:.1e} of a stage's move ({stage_move:.2e})")
    assert worst <= SHARE_OF_A_STAGE * stage_move


def train_on_ranks(argv: list[str], kill_after_checkpoint: int | None = None) -> None:
    """One process of the launch: `specmm ARGV`; the main process SIGKILLs itself right after checkpoint N."""
    from accelerate.state import AcceleratorState, GradientState

    # forked from a process whose OpenMP pool (libgomp) may be running: a child that enters a parallel region with
    # more than one thread waits forever for pool threads fork did not copy (the test run alone, 2 intra-op threads).
    # One thread, and OMP_NUM_THREADS so that accelerate's CPU set-up does not raise it to cores per process again.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    AcceleratorState._reset_state(reset_partial_state=True)  # forked from a process that may have used accelerate
    GradientState._reset_state()
    rank = torch.distributed.get_rank()  # the launcher's process group (a file rendezvous)
    if kill_after_checkpoint is not None and rank == 0:
        original, saved = ddp.save_checkpoint, []

        def save(*args, **kwargs):
            original(*args, **kwargs)
            saved.append(1)
            if len(saved) == kill_after_checkpoint:
                os.kill(os.getpid(), signal.SIGKILL)
        ddp.save_checkpoint = save
    if main(argv):
        raise SystemExit(f"rank {rank}: specmm {' '.join(argv)} failed")


def test_two_processes_train_what_one_process_trains_and_runs_resume_across_process_counts(tiny_zoo, tmp_path,
                                                                                           monkeypatch):
    tiny_zoo("captioner")
    one, two = tmp_path / "one", tmp_path / "two"
    two.mkdir()
    save = eagle_train.save_checkpoint

    def keep_first(drafter, optimizer, schedule, step, checkpoint_dir):  # a copy of the run stopped after step 1
        save(drafter, optimizer, schedule, step, checkpoint_dir)
        if step == 1 and Path(checkpoint_dir).name == "text":
            shutil.copytree(checkpoint_dir, two / "text")
            for cached in ("job.json", "captions.json"):  # the job with its regenerated captions
                shutil.copy(one / cached, two / cached)

    with monkeypatch.context() as patch:
        patch.setattr(eagle_train, "save_checkpoint", keep_first)
        assert main(train_args(one)) == 0  # one process, uninterrupted: the reference
    # two processes resume the stopped one-process run at text step 1; the main one is SIGKILLed after its second
    # checkpoint (text step 2, multimodal step 1). The launcher reports the killed main process, or the other one's
    # lost connection if it notices that first.
    with pytest.raises((ProcessExitedException, ProcessRaisedException)):
        debug_launcher(train_on_ranks, args=(train_args(two), 2), num_processes=2)
    assert torch.load(two / "multimodal" / "trainer_state.pt", weights_only=True)["step"] == 1
    assert not (two / "model.safetensors").exists()
    stage_move = max((weights(one)[k] - weights(one / "text")[k]).abs().max().item() for k in weights(one))
    assert_close(weights(two / "text"), weights(one / "text"), stage_move)  # step 2 on 2 processes = on 1 process
    assert main(train_args(two)) == 0  # one process again: the last multimodal step
    assert_close(weights(two), weights(one), stage_move)


def test_a_shard_takes_its_rows_and_refuses_what_it_cannot_split():
    shard = BatchShard(index=1, count=2, total=lambda t: t)
    ids = torch.tensor([[5, 1], [5, 2], [5, 3], [5, 4]])
    pixels = torch.arange(4.0)[:, None, None, None]  # one image per row
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}
    taken = shard.take(batch, image_token_id=5)
    assert taken["input_ids"].tolist() == [[5, 3], [5, 4]] and taken["pixel_values"].flatten().tolist() == [2.0, 3.0]
    # Qwen-VL: patches of every image flattened; images of 1, 2, 3 and 4 patches
    grid = torch.tensor([[1, 1, 1], [1, 1, 2], [1, 1, 3], [1, 2, 2]])
    qwen = {"input_ids": ids, "image_grid_thw": grid, "pixel_values": torch.arange(10.0)[:, None]}
    assert shard.take(qwen)["pixel_values"].flatten().tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    with pytest.raises(ValueError, match="do not split evenly over 2 processes"):
        shard.take({"input_ids": ids[:3]})
    with pytest.raises(ValueError, match=r"\['pixel_values'\]: 3 entries for 4 rows"):
        shard.take({"input_ids": ids, "pixel_values": torch.zeros(3, 1, 1, 1)})
    with pytest.raises(ValueError, match=r"rows \[0\] hold no image token"):
        shard.take({**batch, "input_ids": torch.tensor([[1, 1], [5, 2], [5, 3], [5, 4]])}, image_token_id=5)
    # the noise of a shard is what one process draws for those rows
    torch.manual_seed(0)
    whole = torch.rand(4, 3, 2)
    torch.manual_seed(0)
    assert torch.equal(shard.noise(torch.zeros(2, 3, 2)), whole[2:])
