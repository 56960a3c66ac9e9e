"""LlamaGen VQ tokenizer (upstream `tokenizer/tokenizer_image/vq_model.py` layout and key names).

Conv encoder -> 1x1 `quant_conv` -> nearest code of the L2-normalised codebook (cosine) -> codes;
codes -> normalised codebook rows -> `post_quant_conv` -> conv decoder -> image in [-1, 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specmm.image_ar.llamagen.config import VQConfig


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(in_ch), nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2, self.conv2 = _norm(out_ch), nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels of a feature map (1x1 conv projections)."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = _norm(ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).reshape(b, c, h * w) for m in (self.q, self.k, self.v))
        weights = (torch.bmm(q.transpose(1, 2), k) * c ** -0.5).softmax(-1)  # [b, hw_q, hw_k]
        out = torch.bmm(v, weights.transpose(1, 2)).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x.float(), scale_factor=2.0, mode="nearest").to(x.dtype))


class Level(nn.Module):
    """One resolution: res blocks (with attention at the lowest resolution) and an optional resampler."""

    def __init__(self, in_ch: int, out_ch: int, blocks: int, attn: bool, resample: type | None):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(in_ch if i == 0 else out_ch, out_ch) for i in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(out_ch) for _ in range(blocks if attn else 0))
        if resample is Downsample:
            self.downsample = Downsample(out_ch)
        elif resample is Upsample:
            self.upsample = Upsample(out_ch)

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        if hasattr(self, "downsample"):
            h = self.downsample(h)
        if hasattr(self, "upsample"):
            h = self.upsample(h)
        return h


def _mid(ch: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)])


class Encoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        levels = len(c.ch_mult)
        self.conv_in = nn.Conv2d(3, c.ch, 3, padding=1)
        ins = [c.ch * m for m in (1, *c.ch_mult[:-1])]
        self.conv_blocks = nn.ModuleList(
            Level(ins[i], c.ch * c.ch_mult[i], c.num_res_blocks, i == levels - 1,
                  Downsample if i < levels - 1 else None) for i in range(levels))
        top = c.ch * c.ch_mult[-1]
        self.mid = _mid(top)
        self.norm_out = _norm(top)
        self.conv_out = nn.Conv2d(top, c.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        levels = len(c.ch_mult)
        top = c.ch * c.ch_mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, top, 3, padding=1)
        self.mid = _mid(top)
        outs = [c.ch * m for m in reversed(c.ch_mult)]
        ins = [top, *outs[:-1]]
        self.conv_blocks = nn.ModuleList(
            Level(ins[i], outs[i], c.num_res_blocks + 1, i == 0, Upsample if i < levels - 1 else None)
            for i in range(levels))
        self.norm_out = _norm(outs[-1])
        self.conv_out = nn.Conv2d(outs[-1], 3, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        self.l2_norm = c.codebook_l2_norm
        self.embedding = nn.Embedding(c.codebook_size, c.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / c.codebook_size, 1.0 / c.codebook_size)
        self.register_buffer("codebook_used", torch.zeros(65536))  # upstream usage counter, kept for loading

    def codebook(self) -> Tensor:
        """[K, D] code vectors as the decoder sees them (L2-normalised when the tokenizer normalises)."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def nearest(self, z: Tensor) -> Tensor:
        """z [B, D, h, w] -> codes [B, h*w] (cosine nearest when normalised, as upstream)."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        if self.l2_norm:
            flat = F.normalize(flat, dim=-1)
        book = self.codebook()
        dist = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * flat @ book.T
        return dist.argmin(1).view(z.shape[0], -1)

    def lookup(self, codes: Tensor, height: int, width: int) -> Tensor:
        """codes [B, h*w] -> code vectors [B, D, h, w]."""
        return self.codebook()[codes].view(codes.shape[0], height, width, -1).permute(0, 3, 1, 2)


class VQModel(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def encode_latent(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] in [-1, 1] -> continuous latents [B, D, h, w] before quantisation."""
        return self.quant_conv(self.encoder(images))

    def encode(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] in [-1, 1] -> codes [B, h*w] (raster order)."""
        return self.quantize.nearest(self.encode_latent(images))

    def decode_latent(self, latent: Tensor) -> Tensor:
        return self.decoder(self.post_quant_conv(latent))

    def decode_code(self, codes: Tensor, height: int | None = None, width: int | None = None) -> Tensor:
        """codes [B, h*w] -> images [B, 3, H, W] in [-1, 1] (square grid unless height/width are given)."""
        side = round(codes.shape[1] ** 0.5)
        height, width = height or side, width or side
        return self.decode_latent(self.quantize.lookup(codes, height, width))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Reconstruction [B, 3, H, W] through the straight-through quantiser, and the codes [B, h*w]."""
        latent = self.encode_latent(images)
        codes = self.quantize.nearest(latent)
        z = F.normalize(latent, dim=1) if self.quantize.l2_norm else latent
        z_q = self.quantize.lookup(codes, latent.shape[2], latent.shape[3])
        return self.decode_latent(z + (z_q - z).detach()), codes
