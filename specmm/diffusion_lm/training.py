"""LLaDA's masked-diffusion objective: mask each token with probability t ~ U(eps, 1), predict the clean
tokens, weight each masked token's cross-entropy by 1/t (an upper bound on the negative log-likelihood)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def noised_batch(clean: Tensor, mask_id: int, generator: torch.Generator, eps: float = 1e-3,
                 keep_prefix: float = 0.0) -> dict[str, Tensor]:
    """Mask `clean` [B, T]; with probability `keep_prefix` a row keeps a random prefix (< T/2) clean, as in
    prompt-conditioned fine-tuning. Returns input_ids, labels, masked, p_mask."""
    b, t = clean.shape
    p_mask = eps + (1 - eps) * torch.rand(b, 1, generator=generator)  # [B, 1]
    masked = torch.rand(b, t, generator=generator) < p_mask  # [B, T]
    prefix = (torch.randint(0, t // 2, (b, 1), generator=generator)
              * (torch.rand(b, 1, generator=generator) < keep_prefix))
    masked &= torch.arange(t)[None] >= prefix
    return {"input_ids": torch.where(masked, mask_id, clean), "labels": clean, "masked": masked,
            "p_mask": p_mask.expand(b, t).clone()}


def masked_diffusion_loss(model, batch: dict[str, Tensor]) -> Tensor:
    """Sum over masked tokens of CE / p_mask, divided by the number of tokens (LLaDA's pre-training loss)."""
    logits = model(batch["input_ids"])[0]  # [B, T, V]
    masked = batch["masked"]
    ce = F.cross_entropy(logits[masked].float(), batch["labels"][masked], reduction="none")
    return (ce / batch["p_mask"][masked]).sum() / masked.numel()


def diffusion_batches(tokens: Tensor, mask_id: int, batch_size: int, seq_len: int, seed: int,
                      keep_prefix: float = 0.5) -> Callable[[int], dict[str, Tensor]]:
    """make_batch(step): windows of a flat token array, masked, a pure function of (seed, step)."""
    def make_batch(step: int) -> dict[str, Tensor]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=gen)
        clean = torch.stack([tokens[s: s + seq_len] for s in starts.tolist()]).long()
        return noised_batch(clean, mask_id, gen, keep_prefix=keep_prefix)
    return make_batch


@torch.no_grad()
def heldout_diffusion_loss(model, tokens: Tensor, mask_id: int, seq_len: int, windows: int = 32,
                           batch_size: int = 8, seed: int = 0) -> float:
    """Masked-diffusion loss (nats per token, an NLL bound) on evenly spaced held-out windows, fixed masks."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    count = min(windows, max(1, (tokens.numel() - 1) // (seq_len + 1)))
    starts = torch.linspace(0, tokens.numel() - seq_len - 1, count).long().tolist()
    total = 0.0
    for i in range(0, len(starts), batch_size):
        clean = torch.stack([tokens[s: s + seq_len] for s in starts[i: i + batch_size]]).long()
        batch = {k: v.to(device) for k, v in noised_batch(clean, mask_id, gen).items()}
        total += masked_diffusion_loss(model, batch).item() * clean.shape[0]
    return total / len(starts)
