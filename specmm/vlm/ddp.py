"""Data-parallel drafter training under `accelerate launch` (DDP through `accelerate.Accelerator`).

Every process loads the frozen target and the same drafter, takes its fixed contiguous share of the rows of each
global batch, and runs the target and the drafter on those rows only. The loss of a shard is divided by the text
slots of the whole batch (summed over processes) times the process count, so DDP's gradient average is exactly the
gradient of the single-process loss of the whole batch; the feature noise is drawn for the whole batch on every
process (same seed, same draws) and sliced, so each row gets the noise it gets in one process. Only the main
process shows progress and writes checkpoints, in the single-process format: a run resumes with any process count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from specmm.core.eagle_train import EagleTrainConfig, resume_checkpoint, save_checkpoint

WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes() -> int:
    """The process count a launcher (`accelerate launch`, torchrun, mpirun) started; 1 without one. Read from the
    environment, so a plain single-process call never initialises accelerate's shared state."""
    for name in WORLD_SIZE_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


@dataclass(frozen=True)
class BatchShard:
    """This process's rows of every global batch: the `index`-th of `count` equal contiguous slices. `total` sums
    a tensor over the processes."""

    index: int
    count: int
    total: Callable[[Tensor], Tensor]

    def rows(self, batch_rows: int) -> slice:
        if batch_rows % self.count:
            raise ValueError(f"batch: {batch_rows} rows do not split evenly over {self.count} processes; use a batch "
                             f"size that is a multiple of {self.count}")
        share = batch_rows // self.count
        return slice(self.index * share, (self.index + 1) * share)

    def take(self, batch: dict[str, Tensor], image_token_id: int | None = None) -> dict[str, Tensor]:
        """This process's rows of a processor batch. Tensors with one entry per row are sliced by rows; Qwen-VL's
        flattened patches are cut per image by `image_grid_thw` (one image per row); anything else is refused."""
        ids = batch["input_ids"]
        total_rows, keep = ids.shape[0], self.rows(ids.shape[0])
        grid = batch.get("image_grid_thw")
        shard = {}
        for key, value in batch.items():
            if key == "pixel_values" and grid is not None and grid.shape[0] == total_rows:
                bounds = torch.cat([grid.new_zeros(1), grid.prod(-1).cumsum(0)]).tolist()
                shard[key] = value[bounds[keep.start]: bounds[keep.stop]]
            elif value.shape[0] == total_rows:
                shard[key] = value[keep]
            else:
                raise ValueError(f"batch[{key!r}]: {value.shape[0]} entries for {total_rows} rows; data-parallel "
                                 "training splits each batch by rows and needs one image (one entry) per prompt")
        pixels = batch.get("pixel_values")
        if image_token_id is not None and pixels is not None and pixels.dim() == 4:
            without = ~(ids == image_token_id).any(1)
            if bool(without.any()):
                raise ValueError(f"batch: rows {without.nonzero().flatten().tolist()} hold no image token, so the "
                                 "images cannot be matched to rows; data-parallel training needs one image per prompt")
        return shard

    def noise(self, like: Tensor) -> Tensor:
        """Uniform [0, 1) noise for this shard's rows of the whole batch: the values one process draws for them."""
        whole = torch.rand((like.shape[0] * self.count, *like.shape[1:]), dtype=like.dtype, device=like.device)
        return whole[self.rows(whole.shape[0])]

    def mean_divisor(self, weight: Tensor) -> Tensor:
        """What a shard divides its weighted loss sum by: the whole batch's weight over the process count, so the
        average over processes (DDP's) is the whole batch's weighted mean."""
        return self.total(weight.sum().detach()).clamp_min(1) / self.count


class _ShardStep(nn.Module):
    """The head as DDP sees it: forward(step) is one shard's (loss, figures), so DDP's hooks see the head's use."""

    def __init__(self, head: nn.Module, shard_loss: Callable[[int], tuple[Tensor, dict]]):
        super().__init__()
        self.head = head
        self._shard_loss = shard_loss

    def forward(self, step: int) -> tuple[Tensor, dict]:
        return self._shard_loss(step)


def train_data_parallel(drafter, shard_loss: Callable[[int, BatchShard], tuple[Tensor, dict[str, float]]],
                        config: EagleTrainConfig, *, checkpoint_dir: str | Path | None = None, desc: str = "drafter",
                        progress: bool = True, on_step: Callable[[int, float, dict], None] | None = None
                        ) -> list[float]:
    """`train_head`'s loop (AdamW, warm-up, value clipping, checkpoints, resume) over the launched processes.
    Returns every step's loss of the whole batch (the mean over processes), the same list on every process;
    `on_step` and the progress bar run on the main process only."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    device = next(drafter.head.parameters()).device
    # heads leave some modules unused in a stage (ViSpec's image pooling on text): DDP must not wait for them
    accelerator = Accelerator(cpu=device.type == "cpu", device_placement=False,
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    if device.type != accelerator.device.type or (device.type == "cuda" and device != accelerator.device):
        raise ValueError(f"drafter: on {device}, but process {accelerator.process_index} trains on "
                         f"{accelerator.device}; load the target and drafter on the process's own device")
    shard = BatchShard(accelerator.process_index, accelerator.num_processes, lambda t: accelerator.reduce(t, "sum"))
    params = [p for p in drafter.head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(config.warmup_steps, 1)))
    start = _resume(drafter, optimizer, schedule, checkpoint_dir, device)
    # the schedule is not prepared: accelerate would step it once per process
    model, prepared = accelerator.prepare(_ShardStep(drafter.head, lambda step: shard_loss(step, shard)), optimizer)
    main = accelerator.is_main_process
    drafter.head.train()
    losses = []
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=desc,
               disable=not (progress and main))
    for step in bar:
        loss, parts = model(step)
        whole = accelerator.reduce(loss.detach(), "mean").item()  # the single-process loss of the whole batch
        if not math.isfinite(whole):
            raise FloatingPointError(f"train_drafter: loss is {whole} at step {step}")
        prepared.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        torch.nn.utils.clip_grad_value_(params, config.grad_clip)
        prepared.step()
        schedule.step()
        losses.append(whole)
        if main:
            bar.set_postfix(loss=f"{whole:.4f}", **{k: f"{v:.2f}" for k, v in parts.items()})
            if on_step is not None:
                on_step(step, whole, parts)
            if checkpoint_dir is not None and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
                save_checkpoint(drafter, optimizer, schedule, step + 1, checkpoint_dir)
    drafter.head.eval()
    return losses


def _resume(drafter, optimizer, schedule, checkpoint_dir, device: torch.device) -> int:
    """`resume_checkpoint` on every process. On a GPU, every process's generator continues from the main process's
    (cuda:0 under `accelerate launch`): they drew the same numbers, so they stand where it stood."""
    start = resume_checkpoint(drafter, optimizer, schedule, checkpoint_dir)
    if start and device.type == "cuda":
        state = torch.load(Path(checkpoint_dir) / "trainer_state.pt", map_location="cpu", weights_only=True, mmap=True)
        if "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"][0], device)
    return start


__all__ = ["BatchShard", "launched_processes", "train_data_parallel"]
