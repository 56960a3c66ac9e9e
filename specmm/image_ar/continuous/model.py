"""A small class-conditional continuous-token AR model: a causal transformer over latent tokens plus a per-token head.

Tokens are the cells of a `grid x grid` latent map, each a `token_dim` vector. The model generates them in an
order (raster by default, or a random permutation per image, `order="random"`): the input at step i carries the
previous token's value and grid position plus the grid position to predict next (a "query"), so one network
serves any order. `features(tokens, labels, orders)` gives the feature z of every step in one causal forward;
the head turns z into a token by its Gaussian chain.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from specmm.image_ar.continuous.heads import DDPMHead, GaussianHead

CONFIG, WEIGHTS = "config.json", "model.safetensors"


@dataclass(frozen=True)
class ContinuousARConfig:
    token_dim: int = 4  # channels of a latent token
    grid: int = 8  # latent map side; tokens per image = grid^2
    num_classes: int = 10
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    head: str = "ddpm"  # "ddpm" (denoiser, `diffusion_steps` steps) or "gaussian" (one exact Gaussian step)
    head_width: int = 128
    head_depth: int = 2
    diffusion_steps: int = 8
    beta_schedule: str = "squaredcos_cap_v2"
    order: str = "raster"  # "raster" or "random" (a fresh permutation per image)

    def __post_init__(self) -> None:
        for name in ("token_dim", "grid", "num_classes", "hidden_size", "num_layers", "num_heads", "head_width",
                     "head_depth", "diffusion_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: must divide hidden_size {self.hidden_size}, got {self.num_heads}")
        if self.head not in ("ddpm", "gaussian"):
            raise ValueError(f"head: expected 'ddpm' or 'gaussian', got {self.head!r}")
        if self.order not in ("raster", "random"):
            raise ValueError(f"order: expected 'raster' or 'random', got {self.order!r}")

    @property
    def num_tokens(self) -> int:
        return self.grid * self.grid


class ContinuousAR(nn.Module):
    """Causal transformer (stock `nn.TransformerEncoder`, pre-norm) + per-token head."""

    def __init__(self, config: ContinuousARConfig):
        super().__init__()
        self.config = config
        d, n = config.hidden_size, config.num_tokens
        self.class_embed = nn.Embedding(config.num_classes, d)
        self.value = nn.Linear(config.token_dim, d)
        self.position = nn.Parameter(torch.randn(n, d) * 0.02)  # grid position of the token fed in
        self.query = nn.Parameter(torch.randn(n, d) * 0.02)  # grid position of the token to predict
        layer = nn.TransformerEncoderLayer(d, config.num_heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.backbone = nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        if config.head == "ddpm":
            self.head = DDPMHead(config.token_dim, d, config.head_width, config.head_depth, config.diffusion_steps,
                                 config.beta_schedule)
        else:
            self.head = GaussianHead(config.token_dim, d, config.head_width, config.head_depth)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(n), persistent=False)

    def raster_orders(self, batch: int, device: torch.device | None = None) -> Tensor:
        return torch.arange(self.config.num_tokens, device=device).expand(batch, -1)

    def features(self, tokens: Tensor, labels: Tensor, orders: Tensor) -> Tensor:
        """tokens [B, N, C] in generation order (step i's token at [:, i]), labels [B], orders [B, N] -> z [B, N, H].

        z[:, i] depends only on labels and tokens[:, :i]; whatever sits at later steps is ignored.
        """
        _b, n = orders.shape
        fed = self.value(tokens[:, :-1]) + self.position[orders[:, :-1]]  # [B, N-1, H]
        inputs = torch.cat([self.class_embed(labels)[:, None], fed], 1) + self.query[orders]  # [B, N, H]
        mask = self.causal[:n, :n].to(inputs.dtype)
        return self.norm(self.backbone(inputs, mask=mask, is_causal=True))

    def loss(self, latents: Tensor, labels: Tensor, generator: torch.Generator | None = None,
             head_repeats: int = 1) -> Tensor:
        """Teacher-forced head loss over every token; latents [B, N, C] in raster order.

        `head_repeats` scores each token at that many denoising steps (MAR's diffusion batch multiplier).
        """
        b, n, _ = latents.shape
        if self.config.order == "random":
            orders = torch.argsort(torch.rand(b, n, generator=generator, device=latents.device), -1)
        else:
            orders = self.raster_orders(b, latents.device)
        tokens = torch.gather(latents, 1, orders[..., None].expand_as(latents))
        z = self.features(tokens, labels, orders)
        return self.head.loss(tokens.flatten(0, 1).repeat(head_repeats, 1), z.flatten(0, 1).repeat(head_repeats, 1),
                              generator)

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps(asdict(self.config), indent=2))
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, folder / WEIGHTS)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> ContinuousAR:
        folder = Path(folder)
        if not (folder / CONFIG).is_file():
            raise FileNotFoundError(f"folder: no {CONFIG} in {folder}")
        model = cls(ContinuousARConfig(**json.loads((folder / CONFIG).read_text())))
        model.load_state_dict(load_file(folder / WEIGHTS))
        return model.to(device=device, dtype=dtype).eval()
