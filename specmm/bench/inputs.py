"""Models and prompts a benchmark runs on: a zoo entry, the user's own folders, or random weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

DEFAULT_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\ndef list_python_files(root):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@dataclass
class BenchInputs:
    target: nn.Module
    draft: nn.Module | None
    input_ids: Tensor  # [B, L] left-padded
    attention_mask: Tensor
    eos_token_id: int | None
    pad_token_id: int
    description: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokenizer: object | None = None
    prompts: list[str] = field(default_factory=list)


def _tokenize(tokenizer, prompts: list[str], device) -> tuple[Tensor, Tensor]:
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def from_zoo(name: str, scale: str, batch: int, device, dtype) -> BenchInputs:
    from specmm import zoo
    from specmm.zoo import code

    if name != "code":
        raise ValueError(f"--zoo: the core benchmark runs on the 'code' entry, got {name!r}")
    path = zoo.build(name, scale)
    models = code.load(path, device, dtype)
    record = zoo.record(name, scale)
    prompts = models.prompts[:batch]
    ids, mask = _tokenize(models.tokenizer, prompts, device)
    description = {"models": f"zoo '{name}' ({scale}) at {path}",
                   "target": f"{record['models']['target']['parameters'] / 1e6:.2f}M params, held-out loss "
                             f"{record['models']['target']['heldout_loss']:.3f}",
                   "draft": f"{record['models']['draft']['parameters'] / 1e6:.2f}M params, held-out loss "
                            f"{record['models']['draft']['heldout_loss']:.3f}",
                   "greedy agreement (zoo.json)": f"{record['greedy_agreement']:.3f}",
                   "prompts": "held-out stdlib files (never trained on)", "dtype": str(dtype)}
    notes = ["Greedy decoding; 'outputs match' compares every row's tokens with target-only generate.",
             "On a CPU each draft-model forward costs about 0.2 target forwards (framework overhead dominates "
             "models this small), so model drafts barely pay; prompt lookup has no draft cost."]
    return BenchInputs(models.target, models.draft, ids, mask, None, models.tokenizer.pad_token_id,
                       description, notes=notes, tokenizer=models.tokenizer, prompts=prompts)


def eagle_factory(eagle, target: nn.Module):
    """A new drafter like `eagle` (an `EagleDrafter`) per generation, over its head and `target`: drafters keep
    per-generation state."""
    return lambda: type(eagle)(eagle.head, target)


def zoo_code_drafters(data: BenchInputs, drafts: list[str], scale: str, device, dtype) -> dict:
    """label -> drafter factory for the zoo `code-drafts` drafters named in `drafts` (built on first use); drops
    `data.draft` when "code" is not named, and describes what it loads in `data.description`."""
    from specmm import zoo
    from specmm.drafters import ModelDrafter
    from specmm.zoo import code_drafts

    if "code" not in drafts:
        data.draft = None
        data.description.pop("draft", None)
    wanted = [name for name in code_drafts.DRAFTERS if name in drafts]
    if not wanted:
        return {}
    path = zoo.build("code-drafts", scale)
    record = zoo.record("code-drafts", scale)["drafters"]
    factories = {}
    for name in wanted:
        drafter = code_drafts.load(path, name, data.target, device, dtype)
        if name == "eagle":
            factories[name] = eagle_factory(drafter, data.target)
        else:
            factories[name] = lambda model=drafter: ModelDrafter(model)
        figures = record[name]
        data.description[f"{name} drafter"] = (
            f"zoo code-drafts-{scale}/{name}: {figures['parameters'] / 1e6:.2f}M params, {figures['steps']} steps; "
            f"greedy agreement {figures['greedy_agreement_before']:.3f} -> {figures['greedy_agreement']:.3f}")
    return factories


def from_paths(target: str, draft: str | None, prompts_file: str | None, batch: int, device, dtype) -> BenchInputs:
    kwargs = dict(dtype=dtype, attn_implementation="sdpa")
    target_model = AutoModelForCausalLM.from_pretrained(target, **kwargs).to(device).eval()
    draft_model = AutoModelForCausalLM.from_pretrained(draft, **kwargs).to(device).eval() if draft else None
    tokenizer = AutoTokenizer.from_pretrained(target)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = Path(prompts_file).read_text().splitlines() if prompts_file else DEFAULT_PROMPTS
    prompts = [p for p in prompts if p.strip()][:batch]
    ids, mask = _tokenize(tokenizer, prompts, device)
    return BenchInputs(target_model, draft_model, ids, mask, tokenizer.eos_token_id, tokenizer.pad_token_id,
                       {"target": target, "draft": draft or "-", "dtype": str(dtype)}, tokenizer=tokenizer,
                       prompts=prompts)


def random_pair(batch: int, device, dtype, vocab: int = 4096) -> BenchInputs:
    """A deep random Llama target and a one-layer random draft: exercises the machinery only."""
    def make(hidden, layers, seed):
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                             intermediate_size=hidden * 3, num_attention_heads=hidden // 32,
                             num_key_value_heads=hidden // 32, max_position_embeddings=2048, pad_token_id=0,
                             bos_token_id=None, eos_token_id=None)
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, 48), generator=gen).to(device)
    return BenchInputs(make(256, 8, 0), make(96, 1, 1), ids, torch.ones_like(ids), None, 0,
                       {"models": "random weights (Llama 8x256 target, 1x96 draft)", "dtype": str(dtype)},
                       notes=["RANDOM WEIGHTS: the draft does not agree with the target, so acceptance and speedup "
                              "are meaningless here; this run only checks the machinery and exactness. Use "
                              "`--zoo code` (trained reference models) or your own `--target/--draft`."])
