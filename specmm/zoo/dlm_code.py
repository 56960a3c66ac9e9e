"""Zoo entry `dlm-code`: a masked diffusion LM in LLaDA's layout trained on the `code` corpus.

Reuses the `code` entry's corpus split and byte-level BPE tokenizer (built first if needed) with one added
mask token, and trains `MaskedDiffusionLM` with LLaDA's objective (half the rows keep a clean prefix, as
prompt-conditioned fine-tuning does). Saved in LLaDA's folder layout next to the tokenizer; held-out
prompt windows and their true continuations are kept for `specmm bench dlm`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from specmm.diffusion_lm.model import LLaDAConfig, MaskedDiffusionLM
from specmm.diffusion_lm.training import (
    diffusion_batches,
    heldout_diffusion_loss,
    masked_diffusion_loss,
)
from specmm.zoo import code
from specmm.zoo.lm_training import GPU_TRAINING, LMTrainConfig, train_causal_lm

logger = logging.getLogger(__name__)

MASK = "<|mdm_mask|>"

RECIPES = {
    # seconds: for tests of the recipe machinery
    "tiny": {"code_scale": "tiny", "max_sequence_length": 256,
             "model": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1, "n_layers": 2, "mlp_hidden_size": 64},
             "train": {"steps": 6, "batch_size": 4, "seq_len": 32, "checkpoint_every": 3, "warmup_steps": 2},
             "eval": {"windows": 4, "seq_len": 32, "prompts": 4, "prompt_tokens": 16, "continuation_tokens": 16}},
    # <= 6 minutes on 2 idle CPU cores
    "cpu": {"code_scale": "cpu", "max_sequence_length": 512,
            "model": {"d_model": 192, "n_heads": 6, "n_kv_heads": 3, "n_layers": 4, "mlp_hidden_size": 512},
            "train": {"steps": 700, "batch_size": 16, "seq_len": 96, "lr": 3e-3, "warmup_steps": 20,
                      "checkpoint_every": 25},
            "eval": {"windows": 32, "seq_len": 96, "prompts": 32, "prompt_tokens": 32, "continuation_tokens": 64}},
    # the `dlm` step on one H100 (untested: no GPU run yet): ~88M params (768 wide, 12 layers), 1500 steps x 32 x 512
    # = 25M tokens: 6 x 88M x 25M = 1.3e16 FLOPs, ~35 s at 400 TFLOP/s (~1.5 min with overheads). code-gpu (its
    # tokenizer, and the AR judge) comes from `core` on a warm machine, else adds ~4.5 min.
    "gpu": {"code_scale": "gpu", "max_sequence_length": 2048,
            "model": {"d_model": 768, "n_heads": 12, "n_kv_heads": 4, "n_layers": 12, "mlp_hidden_size": 2048},
            "train": {"steps": 1500, "batch_size": 32, "seq_len": 512, "lr": 1e-3, "warmup_steps": 100,
                      "checkpoint_every": 250, **GPU_TRAINING},
            "eval": {"windows": 64, "seq_len": 512, "prompts": 64, "prompt_tokens": 128,
                     "continuation_tokens": 256}},
}


def tokenizer_with_mask(code_scale: str, progress: bool = False) -> PreTrainedTokenizerFast:
    """The `code` entry's tokenizer plus the mask token (appended, so every other id is unchanged)."""
    from specmm import zoo

    tokenizer = PreTrainedTokenizerFast.from_pretrained(zoo.build("code", code_scale, progress=progress) / "target")
    tokenizer.add_special_tokens({"mask_token": MASK})
    return tokenizer


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Build the entry into `dest` (checkpoints in dest/work); returns the zoo.json record."""
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_with_mask(recipe["code_scale"], progress)
    code_recipe = code.RECIPES[recipe["code_scale"]]
    tokens = code.corpus_tokens(tokenizer, code_recipe, work)
    config = LLaDAConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         max_sequence_length=recipe["max_sequence_length"], rope_theta=10000.0, **recipe["model"])
    model = MaskedDiffusionLM(config).init_weights(seed=seed)
    train = LMTrainConfig(seed=seed, **recipe["train"])
    batches = diffusion_batches(tokens["train"], config.mask_token_id, train.batch_size, train.seq_len, seed)
    losses = train_causal_lm(model, batches, train, work / "model", desc="dlm-code", progress=progress,
                             loss_fn=masked_diffusion_loss)
    ev = recipe["eval"]
    loss = heldout_diffusion_loss(model, tokens["heldout"], config.mask_token_id, ev["seq_len"], ev["windows"])
    model.save_pretrained(dest / "model")
    tokenizer.save_pretrained(dest / "model")
    window = ev["prompt_tokens"] + ev["continuation_tokens"]
    held = code.heldout_prompts(tokenizer, tokens["heldout"], ev["prompts"], window)  # [n, prompt + continuation]
    (dest / "prompts.json").write_text(json.dumps({"prompt_ids": held[:, : ev["prompt_tokens"]].tolist(),
                                                   "continuation_ids": held[:, ev["prompt_tokens"]:].tolist()}))
    tail = losses[-max(1, len(losses) // 20):]
    return {"corpus": {"train_tokens": tokens["train"].numel(), "heldout_tokens": tokens["heldout"].numel(),
                       "vocab_size": len(tokenizer), "mask_token_id": config.mask_token_id,
                       "tokenizer": f"code-{recipe['code_scale']} + {MASK}"},
            "model": {"parameters": sum(p.numel() for p in model.parameters()), "steps": train.steps,
                      "tokens_seen": train.steps * train.batch_size * train.seq_len,
                      "final_train_loss": sum(tail) / len(tail), "heldout_diffusion_loss": loss}}


@dataclass
class DLMCode:
    model: MaskedDiffusionLM
    tokenizer: PreTrainedTokenizerFast
    prompt_ids: list[list[int]]
    continuation_ids: list[list[int]]


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DLMCode:
    """Load a built `dlm-code` entry the way a user's LLaDA folder is loaded."""
    model = MaskedDiffusionLM.from_pretrained(path / "model", dtype=dtype, device=device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "model")
    held = json.loads((path / "prompts.json").read_text())
    return DLMCode(model, tokenizer, held["prompt_ids"], held["continuation_ids"])
