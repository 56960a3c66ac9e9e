"""Zoo entry `ssm-code`: a Mamba2 target and a Bamba hybrid (Mamba2 + attention) target on the `code` corpus.

Both are stock HF classes trained from scratch on the Python standard library with the `code` entry's
tokenizer, so the `code` entry's small Llama draft proposes for them (same vocabulary). Built after, and
from, the `code` entry at the matching scale.

Entry `ssm-code-drafts`: that draft distilled onto each target (`specmm.drafters.distill_draft`, forward KL on the
code corpus), as STree's own experiments draft with a KL-distilled model; saved per role, like a user's folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    BambaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    PreTrainedTokenizerFast,
)

from specmm.core.draft_distill import DistillConfig, text_windows
from specmm.zoo import code
from specmm.zoo.lm_training import (
    GPU_TRAINING_EAGER,
    LMTrainConfig,
    heldout_loss,
    save_trained_lm,
    token_windows,
    train_causal_lm,
)

logger = logging.getLogger(__name__)

ROLES = ("mamba2", "hybrid")

RECIPES = {
    # seconds: for tests of the recipe machinery
    "tiny": {
        "code_scale": "tiny",
        "mamba2": {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "state_size": 16,
                   "n_groups": 1, "chunk_size": 32},
        "hybrid": {"hidden_size": 32, "num_hidden_layers": 3, "attn_layer_indices": [1], "num_attention_heads": 2,
                   "num_key_value_heads": 1, "intermediate_size": 64, "mamba_n_heads": 4, "mamba_d_head": 16,
                   "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_chunk_size": 32},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "checkpoint_every": 2, "warmup_steps": 1},
        "eval": {"windows": 2, "seq_len": 32, "prompts": 2, "prompt_tokens": 16, "new_tokens": 8},
    },
    # ~7 minutes on 2 CPU cores: 12-layer targets. At these sizes a CPU forward costs ~1 ms of framework
    # overhead per layer whatever the width, so depth sets the target/draft latency ratio, as model size
    # does on real hardware; with 4 layers the one-layer draft cost as much as a third of the target.
    "cpu": {
        "code_scale": "cpu",
        "mamba2": {"hidden_size": 192, "num_hidden_layers": 12, "num_heads": 12, "head_dim": 32, "state_size": 32,
                   "n_groups": 1, "chunk_size": 64},
        "hybrid": {"hidden_size": 192, "num_hidden_layers": 12, "attn_layer_indices": [5, 11],
                   "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 512, "mamba_n_heads": 12,
                   "mamba_d_head": 32, "mamba_d_state": 32, "mamba_n_groups": 1, "mamba_chunk_size": 64},
        "train": {"steps": 300, "batch_size": 8, "seq_len": 128, "lr": 2e-3, "warmup_steps": 20,
                  "checkpoint_every": 25},
        "eval": {"windows": 16, "seq_len": 128, "prompts": 16, "prompt_tokens": 64, "new_tokens": 32},
    },
    # the `ssm` step on one H100 (untested: no GPU run yet). Targets ~55M params each (768 wide, 12 layers), 600
    # steps x 32 x 512 = 9.8M tokens: 6 x 55M x 9.8M = 3.2e15 FLOPs, seconds at 400 TFLOP/s, but HF's Mamba2 runs
    # its reference PyTorch scan here (no mamba_ssm kernels), ~10x slower: ~1.5 min per target, eager (the
    # reference scan is not a compile target). With code-gpu built by `core` on the same warm machine the step is
    # ~3 min + the bench; from a bare machine code-gpu adds ~4.5 min (~8.5 min: tight).
    "gpu": {
        "code_scale": "gpu",
        "mamba2": {"hidden_size": 768, "num_hidden_layers": 12, "num_heads": 24, "head_dim": 64, "state_size": 64,
                   "n_groups": 1, "chunk_size": 128},
        "hybrid": {"hidden_size": 768, "num_hidden_layers": 12, "attn_layer_indices": [5, 11],
                   "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 2048,
                   "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 64, "mamba_n_groups": 1,
                   "mamba_chunk_size": 128},
        "train": {"steps": 600, "batch_size": 32, "seq_len": 512, "lr": 1e-3, "warmup_steps": 50,
                  "checkpoint_every": 200, **GPU_TRAINING_EAGER},
        "eval": {"windows": 32, "seq_len": 512, "prompts": 32, "prompt_tokens": 128, "new_tokens": 32},
    },
}


def make_model(role: str, size: dict, tokenizer: PreTrainedTokenizerFast, seed: int):
    common = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.eos_token_id,
              "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
              "tie_word_embeddings": False}
    torch.manual_seed(seed)
    if role == "mamba2":
        return Mamba2ForCausalLM(Mamba2Config(expand=2, conv_kernel=4, **common, **size))
    config = BambaConfig(mamba_expand=2, mamba_d_conv=4, max_position_embeddings=4096, **common, **size)
    config._attn_implementation = "sdpa"
    return BambaForCausalLM(config)


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Build into `dest` (checkpoints in dest/work); the `code` entry is built first if needed."""
    from specmm import zoo  # the registry imports this module

    code_dir = zoo.build("code", recipe["code_scale"], seed=seed, progress=progress)
    code_recipe = zoo.record("code", recipe["code_scale"])["recipe"]
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(code_dir / "target")
    tokens = code.corpus_tokens(tokenizer, code_recipe, work)
    draft = AutoModelForCausalLM.from_pretrained(code_dir / "draft", attn_implementation="sdpa").eval()
    ev = recipe["eval"]
    prompts = code.heldout_prompts(tokenizer, tokens["heldout"], ev["prompts"], ev["prompt_tokens"])
    record = {"code_entry": str(code_dir), "models": {}}
    for offset, role in enumerate(ROLES):
        model = make_model(role, recipe[role], tokenizer, seed + 10 + offset)
        config = LMTrainConfig(seed=seed + 10 + offset, **recipe["train"])
        losses = train_causal_lm(model, token_windows(tokens["train"], config), config, work / role,
                                 desc=f"ssm-code/{role}", progress=progress)
        with torch.no_grad():
            loss = heldout_loss(model, tokens["heldout"], ev["seq_len"], windows=ev["windows"])
        record["models"][role] = {
            "class": type(model).__name__, **save_trained_lm(model, tokenizer, dest / role, losses, config),
            "tokens_seen": config.steps * config.batch_size * config.seq_len, "heldout_loss": loss,
            "greedy_agreement_with_code_draft": code.greedy_agreement(model, draft, prompts, ev["new_tokens"])}
    (dest / "prompts.json").write_text(json.dumps(tokenizer.batch_decode(prompts), indent=1))
    return record


def load(path: Path, role: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """(target, tokenizer, prompts) of a built entry; `role` is 'mamba2' or 'hybrid'."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
    kwargs = {"dtype": dtype} if role == "mamba2" else {"dtype": dtype, "attn_implementation": "sdpa"}
    target = AutoModelForCausalLM.from_pretrained(path / role, **kwargs).to(device).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / role)
    tokenizer.padding_side = "left"
    return target, tokenizer, json.loads((path / "prompts.json").read_text())


DRAFT_RECIPES = {
    "tiny": {"ssm_scale": "tiny", "steps": 3, "batch_size": 2, "seq_len": 32, "lr": 1e-3, "warmup_steps": 1,
             "checkpoint_every": 2},
    # 285 s on 2 CPU cores, with other jobs running (the target's forward is most of a step); greedy agreement
    # with the target 0.53 / 0.61 (mamba2 / hybrid) -> 0.71 / 0.75 (`specmm zoo build ssm-code-drafts --scale cpu`)
    "cpu": {"ssm_scale": "cpu", "steps": 400, "batch_size": 8, "seq_len": 128, "lr": 1e-3, "warmup_steps": 20,
            "checkpoint_every": 100},
    # untested (no GPU run yet): a few thousand target forwards of 32 x 512 tokens, about a minute per role
    "gpu": {"ssm_scale": "gpu", "device": "cuda", "steps": 1000, "batch_size": 32, "seq_len": 512, "lr": 1e-3,
            "warmup_steps": 50, "checkpoint_every": 250},
}


def build_drafts(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Distil the `code` draft onto each `ssm-code` target (built first if needed); checkpoints in dest/work."""
    from specmm import zoo  # the registry imports this module

    ssm_dir = zoo.build("ssm-code", recipe["ssm_scale"], seed=seed, progress=progress)
    ssm_record = zoo.record("ssm-code", recipe["ssm_scale"], seed=seed)
    code_dir = Path(ssm_record["code_entry"])
    device = zoo.training_device(recipe)
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(code_dir / "target")
    tokens = code.corpus_tokens(tokenizer, zoo.record("code", ssm_record["recipe"]["code_scale"], seed=seed)["recipe"],
                                work)
    ev = ssm_record["recipe"]["eval"]
    prompts = code.heldout_prompts(tokenizer, tokens["heldout"], ev["prompts"], ev["prompt_tokens"]).to(device)
    heldout = text_windows(tokens["heldout"], ev["windows"], ev["seq_len"], seed)(0).to(device)
    config = DistillConfig(steps=recipe["steps"], lr=recipe["lr"], warmup_steps=recipe["warmup_steps"],
                           checkpoint_every=recipe["checkpoint_every"])
    record = {"ssm_code": str(ssm_dir), "code_draft": str(code_dir / "draft"), "drafts": {}}
    for offset, role in enumerate(ROLES):
        target, _, _ = load(ssm_dir, role, device)
        draft = AutoModelForCausalLM.from_pretrained(code_dir / "draft", attn_implementation="sdpa").to(device)
        windows = text_windows(tokens["train"], recipe["batch_size"], recipe["seq_len"], seed + 20 + offset)
        distilled = code.distil_and_save(draft, target, windows, config, heldout, tokenizer, dest / role, work / role,
                                         progress)
        record["drafts"][role] = {
            "parameters": sum(p.numel() for p in draft.parameters()), "steps": config.steps,
            "tokens_seen": config.steps * recipe["batch_size"] * recipe["seq_len"],
            "heldout_kl_before": distilled["heldout_kl_before"], "heldout_kl": distilled["heldout_kl"],
            "greedy_agreement_before": ssm_record["models"][role]["greedy_agreement_with_code_draft"],
            "greedy_agreement": code.greedy_agreement(target, draft, prompts, ev["new_tokens"])}
    return record


def load_draft(path: Path, role: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """The draft of an `ssm-code-drafts` build distilled onto target `role`."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
    return AutoModelForCausalLM.from_pretrained(path / role, dtype=dtype, attn_implementation="sdpa").to(device).eval()
