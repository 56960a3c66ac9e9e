"""Zoo entry `code-drafts`: two better-aligned drafters for the zoo `code` target, for `specmm bench core`.

- `eagle/`: an EAGLE head (one decoder layer over the target's last-layer features, the target's own embeddings
  and LM head; `specmm.core.eagle`) trained against the target on the code corpus (`train_eagle`).
- `distilled/`: the `code` draft distilled onto the target (forward KL on the corpus, `distill_draft`).

Both are saved as a user's folders would be (`EagleDrafter.save_pretrained`, `save_pretrained`). zoo.json records
each one's held-out agreement with the target's greedy text before and after, the figure drafts are accepted by.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specmm.core.draft_distill import DistillConfig, text_windows
from specmm.core.eagle import EagleDrafter
from specmm.core.eagle_train import EagleTrainConfig, target_features, train_eagle
from specmm.zoo import code

DRAFTERS = ("eagle", "distilled")

RECIPES = {
    "tiny": {"code_scale": "tiny", "eagle": {"steps": 3, "batch_size": 2, "seq_len": 32, "lr": 1e-3,
                                             "warmup_steps": 1, "checkpoint_every": 2},
             "distilled": {"steps": 3, "batch_size": 2, "seq_len": 32, "lr": 1e-3, "warmup_steps": 1,
                           "checkpoint_every": 2}},
    # 1024 s on 2 CPU cores shared with test runs (about 10 minutes idle), the target's forwards most of it; held-out
    # greedy agreement with the target: EAGLE 0.845, distilled 0.570 -> 0.754 (`specmm zoo build code-drafts`, zoo.json)
    "cpu": {"code_scale": "cpu", "eagle": {"steps": 1500, "batch_size": 8, "seq_len": 256, "lr": 1e-3,
                                           "warmup_steps": 20, "checkpoint_every": 100},
            "distilled": {"steps": 400, "batch_size": 8, "seq_len": 256, "lr": 1e-3, "warmup_steps": 20,
                          "checkpoint_every": 100}},
    # untested (no GPU run yet)
    "gpu": {"code_scale": "gpu", "device": "cuda",
            "eagle": {"steps": 3000, "batch_size": 32, "seq_len": 512, "lr": 5e-4, "warmup_steps": 100,
                      "checkpoint_every": 500},
            "distilled": {"steps": 1000, "batch_size": 32, "seq_len": 512, "lr": 1e-3, "warmup_steps": 50,
                          "checkpoint_every": 250}},
}


@torch.no_grad()
def eagle_agreement(drafter: EagleDrafter, target, prompts: torch.Tensor, new_tokens: int,
                    text: torch.Tensor | None = None) -> float:
    """Share of positions where the head's first draft (from the target's true features) is the target's greedy
    token, on the target's own text (`text`, as in `code.greedy_agreement`): that figure for an EAGLE head."""
    out = code.greedy_text(target, prompts, new_tokens) if text is None else text
    features = target_features(target, out, torch.ones_like(out))
    # pair t = (feature f_t, token x_{t+1}) predicts f_{t+1}, whose LM head argmax is the draft of x_{t+2}
    hidden = drafter.head(drafter.embed_tokens(out[:, 1:-1]), features[:, :-2]).last_hidden_state
    predicted = drafter.lm_head(hidden).argmax(-1)[:, prompts.shape[1] - 2:]
    return (predicted == out[:, prompts.shape[1]:]).float().mean().item()


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Train both drafters against the `code` target of `recipe["code_scale"]` (built first if needed)."""
    from specmm import zoo  # the registry imports this module

    code_dir = zoo.build("code", recipe["code_scale"], seed=seed, progress=progress)
    code_record = zoo.record("code", recipe["code_scale"], seed=seed)
    device = zoo.training_device(recipe)
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    models = code.load(code_dir, device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(code_dir / "target")
    tokens = code.corpus_tokens(tokenizer, code_record["recipe"], work)
    ev = code_record["recipe"]["eval"]
    prompts = code.heldout_prompts(tokenizer, tokens["heldout"], ev["prompts"], ev["prompt_tokens"]).to(device)
    text = code.greedy_text(models.target, prompts, ev["new_tokens"])  # every agreement below reads it
    record = {"code": str(code_dir), "drafters": {}}

    torch.manual_seed(seed)  # the head's initial weights; feature noise draws resume from the checkpointed state
    eagle, schedule = EagleDrafter.for_target(models.target), recipe["eagle"]
    before = eagle_agreement(eagle, models.target, prompts, ev["new_tokens"], text)
    windows = text_windows(tokens["train"], schedule["batch_size"], schedule["seq_len"], seed + 30)
    config = EagleTrainConfig(**{k: schedule[k] for k in ("steps", "lr", "warmup_steps", "checkpoint_every")})
    losses = train_eagle(eagle, models.target, windows, config, checkpoint_dir=work / "eagle", progress=progress)
    eagle.save_pretrained(dest / "eagle")
    record["drafters"]["eagle"] = {
        "parameters": sum(p.numel() for p in eagle.head.parameters()), **_schedule_figures(schedule, losses),
        "greedy_agreement_before": before,
        "greedy_agreement": eagle_agreement(eagle, models.target, prompts, ev["new_tokens"], text)}

    schedule = recipe["distilled"]
    heldout = text_windows(tokens["heldout"], ev["windows"], ev["seq_len"], seed)(0).to(device)
    draft = models.draft
    windows = text_windows(tokens["train"], schedule["batch_size"], schedule["seq_len"], seed + 31)
    config = DistillConfig(**{k: schedule[k] for k in ("steps", "lr", "warmup_steps", "checkpoint_every")})
    distilled = code.distil_and_save(draft, models.target, windows, config, heldout, tokenizer, dest / "distilled",
                                     work / "distilled", progress)
    record["drafters"]["distilled"] = {
        "parameters": sum(p.numel() for p in draft.parameters()), **_schedule_figures(schedule, distilled["losses"]),
        "heldout_kl_before": distilled["heldout_kl_before"], "heldout_kl": distilled["heldout_kl"],
        "greedy_agreement_before": code_record["greedy_agreement"],
        "greedy_agreement": code.greedy_agreement(models.target, draft, prompts, ev["new_tokens"], text)}
    return record


def _schedule_figures(schedule: dict, losses: list[float]) -> dict:
    tail = losses[-20:]
    return {"steps": schedule["steps"], "tokens_seen": schedule["steps"] * schedule["batch_size"] * schedule["seq_len"],
            "final_train_loss": sum(tail) / len(tail) if tail else None}


def load(path: Path, which: str, target, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Drafter `which` of a built entry: an `EagleDrafter` over `target` ('eagle'), or the distilled draft model."""
    if which not in DRAFTERS:
        raise ValueError(f"which: expected one of {DRAFTERS}, got {which!r}")
    if which == "eagle":
        return EagleDrafter.from_pretrained(path / "eagle", target)
    return AutoModelForCausalLM.from_pretrained(path / "distilled", dtype=dtype,
                                                attn_implementation="sdpa").to(device).eval()
