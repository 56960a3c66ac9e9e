"""LlamaGen GPT and VQ configurations with upstream field names and size presets."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


@dataclass
class GPTConfig:
    """Upstream `ModelArgs` of `autoregressive/models/gpt.py` (inference fields only; dropouts are off)."""

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256

    def __post_init__(self) -> None:
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"gpt_config: model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        if self.dim % self.n_head:
            raise ValueError(f"gpt_config: dim {self.dim} is not divisible by n_head {self.n_head}")
        if (self.dim // self.n_head) % 4:
            raise ValueError(f"gpt_config: head_dim {self.dim // self.n_head} must be a multiple of 4 (2-D RoPE)")
        if self.grid_size ** 2 != self.block_size:
            raise ValueError(f"gpt_config: block_size {self.block_size} is not a square number of grid tokens")
        if not self.rope_base > 0:
            raise ValueError(f"gpt_config: rope_base must be positive, got {self.rope_base}")
        if self.n_layer < 1:
            raise ValueError(f"gpt_config: n_layer must be at least 1, got {self.n_layer}")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"gpt_config: n_head {self.n_head} must be a multiple of n_kv_head {self.n_kv_head}")
        if self.cls_token_num < 1 or (self.model_type == "c2i" and self.cls_token_num != 1):
            raise ValueError(f"gpt_config: cls_token_num {self.cls_token_num}: a c2i GPT embeds its class as 1 token, "
                             "a t2i GPT needs at least 1 caption token")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def grid_size(self) -> int:
        return round(self.block_size ** 0.5)

    @property
    def ffn_dim(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    @property
    def has_null_class(self) -> bool:
        return self.class_dropout_prob > 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class VQConfig:
    """Upstream `ModelArgs` of `tokenizer/tokenizer_image/vq_model.py`."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    ch: int = 128
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    num_res_blocks: int = 2

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


GPT_PRESETS = {  # upstream GPT_* factories: (n_layer, n_head, dim)
    "GPT-B": {"n_layer": 12, "n_head": 12, "dim": 768},
    "GPT-L": {"n_layer": 24, "n_head": 16, "dim": 1024},
    "GPT-XL": {"n_layer": 36, "n_head": 20, "dim": 1280},
    "GPT-XXL": {"n_layer": 48, "n_head": 24, "dim": 1536},
    "GPT-XXXL": {"n_layer": 48, "n_head": 40, "dim": 2560},
    "GPT-1B": {"n_layer": 22, "n_head": 32, "dim": 2048},
    "GPT-3B": {"n_layer": 24, "n_head": 32, "dim": 3200},
    "GPT-7B": {"n_layer": 32, "n_head": 32, "dim": 4096},
}
VQ_PRESETS = {"VQ-16": {"ch_mult": [1, 1, 2, 2, 4], "z_channels": 256},
              "VQ-8": {"ch_mult": [1, 2, 2, 4], "z_channels": 256}}


def _read(config, presets: dict, name: str) -> dict:
    if isinstance(config, (GPTConfig, VQConfig)):
        return config.to_dict()
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, str) and config in presets:
        return dict(presets[config])
    path = Path(config)
    if not path.is_file():
        raise ValueError(f"{name}: expected a preset ({', '.join(presets)}), a dict or a JSON file, got {config!r}")
    return json.loads(path.read_text())


def gpt_config(config, **overrides) -> GPTConfig:
    """A GPTConfig from a preset name ('GPT-B', ...), a dict, a JSON path or a GPTConfig; `overrides` win."""
    values = {**_read(config, GPT_PRESETS, "gpt_config"), **overrides}
    known = {f.name for f in fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in values.items() if k in known})


def vq_config(config, **overrides) -> VQConfig:
    """A VQConfig from a preset name ('VQ-16', 'VQ-8'), a dict, a JSON path or a VQConfig."""
    values = {**_read(config, VQ_PRESETS, "vq_config"), **overrides}
    known = {f.name for f in fields(VQConfig)}
    return VQConfig(**{k: v for k, v in values.items() if k in known})
