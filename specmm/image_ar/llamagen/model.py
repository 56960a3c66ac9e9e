"""`LlamaGen`: the GPT and its VQ tokenizer together, loaded from upstream `.pt` checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from specmm.image_ar.llamagen.config import GPTConfig, VQConfig, gpt_config, vq_config
from specmm.image_ar.llamagen.gpt import LlamaGenGPT
from specmm.image_ar.llamagen.vq import VQModel


def load_state(path: str | Path, name: str) -> dict[str, Tensor]:
    """Read an upstream checkpoint: `{"model": sd}` (DDP), `{"module": sd}` or a raw state dict; safe unpickling."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{name}: no checkpoint file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(path)
    raw = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("model", "module", "state_dict"):
        if isinstance(raw, dict) and isinstance(raw.get(key), dict):
            return raw[key]
    return raw


def _load(module: nn.Module, state: dict[str, Tensor], name: str) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "quantize.codebook_used"]
    if missing or unexpected:
        raise ValueError(f"{name}: checkpoint does not match the config (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]})")


class LlamaGen(nn.Module):
    """A LlamaGen GPT (c2i or t2i) with its VQ tokenizer; checks that they fit each other."""

    def __init__(self, gpt: LlamaGenGPT, vq: VQModel, image_size: int | None = None):
        super().__init__()
        g, q = gpt.config, vq.config
        if q.codebook_size != g.vocab_size:
            raise ValueError(f"vq_config: codebook_size {q.codebook_size} differs from the GPT vocab_size "
                             f"{g.vocab_size}; the tokenizer and the GPT must share the code vocabulary")
        valid = g.grid_size * q.downsample  # the VQ decoder turns the GPT's token grid into exactly this size
        image_size = valid if image_size is None else image_size
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size != valid:
            raise ValueError(f"image_size: the only valid size for these checkpoints is {valid} px (the GPT's "
                             f"{g.grid_size}x{g.grid_size} token grid, block_size {g.block_size}, times the VQ "
                             f"downsample {q.downsample}), got {image_size!r}; leave --image-size out to use it")
        self.gpt, self.vq, self.image_size = gpt, vq, image_size

    @property
    def config(self) -> GPTConfig:
        return self.gpt.config

    @classmethod
    def from_config(cls, gpt_cfg, vq_cfg, image_size: int | None = None, **gpt_overrides) -> LlamaGen:
        """Randomly initialised models (for training) from configs, presets, dicts or JSON files."""
        return cls(LlamaGenGPT(gpt_config(gpt_cfg, **gpt_overrides)), VQModel(vq_config(vq_cfg)), image_size)

    @classmethod
    def from_checkpoint(cls, gpt_ckpt: str | Path, vq_ckpt: str | Path, gpt_config: str | dict | GPTConfig,
                        vq_config: str | dict | VQConfig = "VQ-16", image_size: int | None = None,
                        **gpt_overrides) -> LlamaGen:
        """Load upstream `.pt` files (`{"model": state_dict}`, upstream key names) with `weights_only=True`.

        Configs are presets ('GPT-B' .. 'GPT-7B', 'VQ-16', 'VQ-8'), dicts or JSON files; `gpt_overrides`
        set e.g. `model_type`, `block_size`, `vocab_size`, `num_classes` on top of a preset.
        """
        model = cls.from_config(gpt_config, vq_config, image_size, **gpt_overrides)
        _load(model.gpt, load_state(gpt_ckpt, "gpt_ckpt"), "gpt_ckpt")
        _load(model.vq, load_state(vq_ckpt, "vq_ckpt"), "vq_ckpt")
        return model.eval()

    def check_conditions(self, conditions: Tensor) -> Tensor:
        """Raise ValueError for class ids out of range or captions of the wrong shape; return them on device."""
        c = self.config
        device = self.gpt.tok_embeddings.weight.device
        if not isinstance(conditions, Tensor):
            conditions = torch.as_tensor(conditions)
        if c.model_type == "c2i":
            if conditions.dim() != 1 or conditions.dtype not in (torch.long, torch.int):
                raise ValueError(f"conditions: expected class ids [B] (integers), got {tuple(conditions.shape)} "
                                 f"{conditions.dtype}")
            if conditions.numel() == 0:
                raise ValueError("conditions: empty batch")
            bad = conditions[(conditions < 0) | (conditions >= c.num_classes)]
            if bad.numel():
                raise ValueError(f"conditions: class id {int(bad[0])} out of range [0, {c.num_classes})")
            return conditions.long().to(device)
        if conditions.dim() != 3 or conditions.shape[1:] != (c.cls_token_num, c.caption_dim):
            raise ValueError(f"conditions: expected caption embeddings [B, {c.cls_token_num}, {c.caption_dim}], "
                             f"got {tuple(conditions.shape)}")
        return conditions.to(device=device, dtype=self.gpt.tok_embeddings.weight.dtype)

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        """Image tokens [B, N] -> images [B, 3, H, W] in [-1, 1]."""
        return self.vq.decode_code(tokens).clamp(-1, 1)
