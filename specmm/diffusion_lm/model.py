"""MaskedDiffusionLM: a bidirectional transformer in LLaDA's parameter layout (no remote code needed).

Keys are LLaDA's (`model.transformer.wte.weight`, `model.transformer.blocks.{i}.q_proj.weight`, ...,
`model.transformer.ln_f.weight`, `model.transformer.ff_out.weight`), config.json keeps LLaDA's field names,
so a local LLaDA folder loads with `from_pretrained` and a saved model loads with LLaDA's own code.
Row i of the logits predicts the token at position i (no shift). An optional prefix cache (Fast-dLLM's
"prefix cache") keeps per-row K/V of the committed prefix and is never mutated in place.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


# upstream LLaDA config fields whose other values change the architecture (None in a config means "off")
_LLADA_FIXED = {"alibi": False, "rope": True, "include_qkv_bias": False, "attention_layer_norm": False,
                "scale_logits": False, "input_emb_norm": False, "multi_query_attention": False,
                "layer_norm_type": "rms", "activation_type": "silu", "block_group_size": 1, "clip_qkv": None}


@dataclass
class LLaDAConfig:
    """The subset of LLaDA's config.json the architecture needs (field names as LLaDA writes them)."""

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: = n_heads
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = None  # rows of wte/ff_out (>= vocab_size); None: = vocab_size
    mask_token_id: int | None = 126336
    eos_token_id: int | None = 126081
    pad_token_id: int | None = None
    max_sequence_length: int = 4096
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    weight_tying: bool = False

    def __post_init__(self):
        self.n_kv_heads = self.n_kv_heads or self.n_heads
        self.embedding_size = self.embedding_size or self.vocab_size
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"config: d_model {self.d_model} must divide by n_heads {self.n_heads}, which must "
                             f"divide by n_kv_heads {self.n_kv_heads}")

    @classmethod
    def from_dict(cls, raw: dict) -> LLaDAConfig:
        """From LLaDA's config.json as published; variants this architecture does not implement are refused."""
        if raw.get("block_type", "llama") != "llama" or raw.get("include_bias", False):
            raise ValueError("config: only LLaDA's llama-style blocks without biases are supported "
                             f"(block_type={raw.get('block_type')!r}, include_bias={raw.get('include_bias')!r})")
        for name, expected in _LLADA_FIXED.items():
            if name in raw and raw[name] is not None and raw[name] != expected:
                raise ValueError(f"config: {name}={raw[name]!r} is not supported (MaskedDiffusionLM implements "
                                 f"LLaDA with {name}={expected!r})")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    def to_dict(self) -> dict:
        return {"model_type": "llada", "architectures": ["LLaDAModelLM"], "block_type": "llama",
                "activation_type": "silu", "layer_norm_type": "rms", "rope": True, "include_bias": False,
                "use_cache": False, **asdict(self)}


@dataclass
class PrefixCache:
    """Per-row K/V of full-length states; positions < lengths[row] are served from here, not recomputed."""

    keys: list[Tensor]  # per layer [B, Hkv, L, D]
    values: list[Tensor]  # per layer [B, Hkv, L, D]
    lengths: Tensor  # [B] cached prefix length per row

    def select(self, rows: Tensor) -> PrefixCache:
        return PrefixCache([k[rows] for k in self.keys], [v[rows] for v in self.values], self.lengths[rows])

    def replace(self, rows: Tensor, other: PrefixCache) -> PrefixCache:
        """A new cache equal to this one with `rows` taken from `other` (no in-place change)."""
        def put(a: Tensor, b: Tensor) -> Tensor:
            return a.index_copy(0, rows, b)
        return PrefixCache([put(a, b) for a, b in zip(self.keys, other.keys)],
                           [put(a, b) for a, b in zip(self.values, other.values)],
                           put(self.lengths, other.lengths))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)  # LLaDA normalises in fp32
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE with the half-split layout of LLaDA/Llama. x [B, H, T, D], cos/sin [B, 1, T, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LLaDABlock(nn.Module):
    """attn_norm -> bidirectional attention -> attn_out; ff_norm -> SwiGLU (ff_proj gate, up_proj) -> ff_out."""

    def __init__(self, c: LLaDAConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.d_model // c.n_heads
        kv = self.n_kv_heads * self.head_dim
        self.attn_norm, self.ff_norm = RMSNorm(c.d_model, c.rms_norm_eps), RMSNorm(c.d_model, c.rms_norm_eps)
        self.q_proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.k_proj, self.v_proj = nn.Linear(c.d_model, kv, bias=False), nn.Linear(c.d_model, kv, bias=False)
        self.attn_out = nn.Linear(c.d_model, c.d_model, bias=False)
        self.ff_proj = nn.Linear(c.d_model, c.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(c.mlp_hidden_size, c.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None,
                cached: tuple[Tensor, Tensor, Tensor, int] | None) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, C]; key_mask [B, S] (True: attend); cached = (keys, values, keep [B, T], start) or None."""
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cached is not None:  # positions below each row's cached length read the cache
            ck, cv, keep, start = cached
            keep = keep[:, None, :, None]
            k = torch.cat((ck[:, :, :start], torch.where(keep, ck[:, :, start:], k)), dim=2)  # [B, Hkv, S, D]
            v = torch.cat((cv[:, :, :start], torch.where(keep, cv[:, :, start:], v)), dim=2)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # [B, 1, 1, S]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False,
                                              enable_gqa=self.n_kv_heads != self.n_heads)
        x = x + self.attn_out(attn.transpose(1, 2).reshape(b, t, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h)), k, v


class _Transformer(nn.Module):
    def __init__(self, c: LLaDAConfig):
        super().__init__()
        self.wte = nn.Embedding(c.embedding_size, c.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(c) for _ in range(c.n_layers))
        self.ln_f = RMSNorm(c.d_model, c.rms_norm_eps)
        if not c.weight_tying:
            self.ff_out = nn.Linear(c.d_model, c.embedding_size, bias=False)


class _Inner(nn.Module):  # gives the `model.transformer.` key prefix of LLaDAModelLM
    def __init__(self, c: LLaDAConfig):
        super().__init__()
        self.transformer = _Transformer(c)


class MaskedDiffusionLM(nn.Module):
    """LLaDA-layout mask predictor: `logits(x)` [B, L, V] predicts the clean token at every position."""

    supports_cache = True

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.config = config
        self.model = _Inner(config)

    @property
    def mask_id(self) -> int | None:
        return self.config.mask_token_id

    def init_weights(self, std: float = 0.02, seed: int | None = None) -> MaskedDiffusionLM:
        """Normal(0, std) weights, residual projections scaled by 1/sqrt(2 * layers) (GPT-2 style)."""
        if seed is not None:
            torch.manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                scale = (2 * self.config.n_layers) ** -0.5 if name.endswith(("attn_out.weight", "ff_out.weight")) \
                    and "blocks" in name else 1.0
                nn.init.normal_(p, 0.0, std * scale)
        return self

    def _rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        head_dim = self.config.d_model // self.config.n_heads  # float64 angles whatever the model dtype
        inv_freq = self.config.rope_theta ** -(torch.arange(0, head_dim, 2, device=position_ids.device,
                                                            dtype=torch.float64) / head_dim)
        freqs = position_ids.double()[..., None] * inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                *, cache: PrefixCache | None = None, start: int = 0, logits_from: int = 0,
                return_cache: bool = False) -> tuple[Tensor, PrefixCache | None]:
        """Logits [B, T - (logits_from - start), V] for positions logits_from.. of the window input_ids [B, T].

        The window starts at sequence position `start`; with `cache`, key/value rows of positions below each
        row's `cache.lengths` come from the cache. `attention_mask` [B, start + T] masks padded keys.
        `return_cache` returns every layer's K/V (lengths set to 0; the caller sets them).
        """
        tr = self.model.transformer
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(start, start + t, device=input_ids.device).expand(b, t)
        x = tr.wte(input_ids)  # [B, T, C]
        cos, sin = self._rope(position_ids, x.dtype)
        key_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        keep = None
        if cache is not None:
            keep = torch.arange(start, start + t, device=input_ids.device) < cache.lengths[:, None]  # [B, T]
        keys, values = [], []
        for i, block in enumerate(tr.blocks):
            cached = None if cache is None else (cache.keys[i], cache.values[i], keep, start)
            x, k, v = block(x, cos, sin, key_mask, cached)
            if return_cache:
                keys.append(k)
                values.append(v)
        h = tr.ln_f(x[:, logits_from - start:])
        logits = F.linear(h, tr.wte.weight if self.config.weight_tying else tr.ff_out.weight)
        logits = logits[..., : self.config.vocab_size]  # [B, T', V]
        new_cache = PrefixCache(keys, values, torch.zeros(b, dtype=torch.long, device=input_ids.device)) \
            if return_cache else None
        return logits, new_cache

    @torch.no_grad()
    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """[B, L, V] logits of full states (the uncached decoding forward)."""
        return self(input_ids, attention_mask, _positions(attention_mask, input_ids))[0]

    # ------------------------------------------------------------------ checkpoints

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2))
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / WEIGHTS_NAME)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> MaskedDiffusionLM:
        """Load a local LLaDA-layout folder (safetensors, sharded safetensors, or a weights-only .bin)."""
        folder = Path(folder)
        if not (folder / CONFIG_NAME).is_file():
            raise ValueError(f"folder: {folder} has no {CONFIG_NAME}")
        config = LLaDAConfig.from_dict(json.loads((folder / CONFIG_NAME).read_text()))
        model = cls(config)
        state = _read_state_dict(folder)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"folder: {folder} is not in LLaDA's layout; missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]}")
        return model.to(device=device, dtype=dtype).eval()


def _positions(attention_mask: Tensor | None, input_ids: Tensor) -> Tensor:
    """[B, L] position ids: 0.. over each row's real tokens (left padding kept at 0)."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _read_state_dict(folder: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    if (folder / WEIGHTS_NAME).is_file():
        return load_file(folder / WEIGHTS_NAME)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        state = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(folder / shard))
        return state
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"folder: {folder} has no model.safetensors, safetensors index or pytorch_model.bin")
