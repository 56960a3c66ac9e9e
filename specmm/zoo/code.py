"""Zoo entry `code`: a Llama target and a ~10x smaller Llama draft trained on the Python standard library.

The corpus is the stdlib source of the running interpreter (text nobody here wrote), split by file into
train and held-out parts; the tokenizer is a byte-level BPE built with `tokenizers` and saved as a HF
fast tokenizer. Both models are stock `LlamaForCausalLM`, saved with `save_pretrained` next to the
tokenizer, so they load like any user's checkpoint folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from specmm.core.draft_distill import distill_draft, heldout_comparison
from specmm.jobs import atomic_writer
from specmm.zoo.lm_training import (
    GPU_TRAINING,
    LMTrainConfig,
    heldout_loss,
    save_trained_lm,
    token_windows,
    train_causal_lm,
)

logger = logging.getLogger(__name__)

EOS, PAD = "<|endoftext|>", "<pad>"

_TINY_TARGET = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=64)
_TINY_DRAFT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                   intermediate_size=32)
RECIPES = {
    # seconds: for tests of the recipe machinery
    "tiny": dict(vocab_size=300, tokenizer_chars=200_000, include_tests=False, max_files=30, max_positions=256,
                 target=_TINY_TARGET, draft=_TINY_DRAFT,
                 target_train=dict(steps=6, batch_size=4, seq_len=32, checkpoint_every=3, warmup_steps=2),
                 draft_train=dict(steps=6, batch_size=4, seq_len=32, checkpoint_every=3, warmup_steps=2),
                 eval=dict(windows=4, seq_len=32, prompts=4, prompt_tokens=16, new_tokens=8)),
    # <= 15 minutes on 2 CPU cores (about 10): a deep, narrow target, since per-layer overhead dominates CPU
    # decoding, and a one-layer draft ~11x smaller
    "cpu": dict(vocab_size=4096, tokenizer_chars=6_000_000, include_tests=False, max_files=None, max_positions=1024,
                target=dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=704),
                draft=dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                           intermediate_size=192),
                target_train=dict(steps=800, batch_size=8, seq_len=256, lr=1.5e-3, warmup_steps=30,
                                  checkpoint_every=25),
                draft_train=dict(steps=250, batch_size=16, seq_len=256, lr=3e-3, warmup_steps=30,
                                 checkpoint_every=50),
                eval=dict(windows=48, seq_len=256, prompts=64, prompt_tokens=64, new_tokens=32)),
    # the `core` step of `specmm bench suite` on one H100, build + bench <= 9 minutes. Target ~158M params (1024 wide,
    # 12 layers, GQA 16/8 heads), 1500 steps x 64 x 512 = 49M tokens: 6 x 158M x 49M = 4.7e16 FLOPs, ~2 min at
    # 400 TFLOP/s. Draft ~9M params (1/17 of the target, as a small same-family draft model is sized against its
    # target in the SD papers), 1500 steps: <1 min (small models are overhead-bound). Tokenizer, encoding and the
    # CPU-side evaluation ~1.5 min: the build ~4.5 min, leaving ~4 for the bench (compiled rows included).
    "gpu": dict(vocab_size=8192, tokenizer_chars=20_000_000, include_tests=True, max_files=None, max_positions=2048,
                target=dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8,
                            intermediate_size=2816),
                draft=dict(hidden_size=384, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                           intermediate_size=1024),
                target_train=dict(steps=1500, batch_size=64, seq_len=512, lr=1e-3, warmup_steps=100,
                                  checkpoint_every=250, **GPU_TRAINING),
                draft_train=dict(steps=1500, batch_size=64, seq_len=512, lr=2e-3, warmup_steps=100,
                                 checkpoint_every=500, **GPU_TRAINING),
                eval=dict(windows=64, seq_len=512, prompts=64, prompt_tokens=128, new_tokens=32)),
}


def stdlib_files(include_tests: bool, max_files: int | None) -> tuple[Path, list[Path]]:
    """The interpreter's stdlib .py files (no site-packages), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if "site-packages" in parts or (not include_tests and ({"test", "tests", "idle_test"} & set(parts))):
            continue
        files.append(path)
    if not files:
        raise RuntimeError(f"no Python standard library sources found under {root}")
    return root, files[:max_files] if max_files else files


def is_heldout(relative: str) -> bool:
    """One file in twenty, chosen by a hash of its path (stable across machines and Python patch versions)."""
    return int(hashlib.sha1(relative.encode()).hexdigest()[:8], 16) % 20 == 0


def read_corpus(include_tests: bool, max_files: int | None) -> tuple[list[str], list[str]]:
    root, files = stdlib_files(include_tests, max_files)
    train, heldout = [], []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        (heldout if is_heldout(str(path.relative_to(root))) else train).append(text)
    if not heldout:  # tiny corpora: keep at least one file out
        heldout.append(train.pop())
    return train, heldout


def train_tokenizer(texts: list[str], vocab_size: int, max_chars: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    budget, sample = max_chars, []
    for text in texts:
        if budget <= 0:
            break
        sample.append(text[:budget])
        budget -= len(sample[-1])
    tokenizer.train_from_iterator(sample, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=1 << 20)


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """Files joined by EOS into one int32 token array."""
    eos = tokenizer.eos_token_id
    ids = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += encoded + [eos]
    return torch.tensor(ids, dtype=torch.int32)


def make_model(size: dict, tokenizer: PreTrainedTokenizerFast, max_positions: int, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=max_positions,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, **size)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # GPT-2 style: residual projections scaled by 1/sqrt(2 * layers); trains much faster
        for layer in model.model.layers:
            for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                weight.normal_(0.0, config.initializer_range / (2 * config.num_hidden_layers) ** 0.5)
    return model


@torch.no_grad()
def greedy_text(target, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """[N, P + new_tokens]: the target's greedy continuation of each prompt [N, P], exactly `new_tokens` long."""
    return target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=target.config.pad_token_id)


@torch.no_grad()
def greedy_agreement(target, draft, prompts: torch.Tensor, new_tokens: int, text: torch.Tensor | None = None) -> float:
    """Share of positions where the draft's argmax equals the target's greedy token, on the target's own text
    (`text`: `greedy_text(target, prompts, new_tokens)` when already at hand)."""
    out = greedy_text(target, prompts, new_tokens) if text is None else text
    predicted = draft(input_ids=out[:, :-1]).logits.argmax(-1)[:, prompts.shape[1] - 1:]
    return (predicted == out[:, prompts.shape[1]:]).float().mean().item()


def distil_and_save(draft, target, windows, config, heldout: torch.Tensor, tokenizer, dest: Path, work: Path,
                    progress: bool) -> dict:
    """Distil `draft` onto `target` (`distill_draft`, resumable from `work`), save it with the tokenizer into `dest`
    like a user's model folder, and return its held-out KL before and after and its training losses."""
    kl_before = heldout_comparison(draft, target, heldout)["kl"]
    losses = distill_draft(draft, target, windows, config, checkpoint_dir=work, progress=progress)
    draft.generation_config.pad_token_id = tokenizer.pad_token_id
    device = next(draft.parameters()).device
    draft.to("cpu").save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    draft.to(device)
    kl_after = heldout_comparison(draft, target, heldout)["kl"]
    return {"losses": losses, "heldout_kl_before": kl_before, "heldout_kl": kl_after}


def heldout_prompts(tokenizer, heldout: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """[count, length] evenly spaced held-out windows that do not cross a file boundary."""
    eos = tokenizer.eos_token_id
    starts, step = [], max(1, (heldout.numel() - length - 1) // (count * 4))
    for s in range(0, heldout.numel() - length - 1, step):
        if len(starts) == count:
            break
        if not (heldout[s: s + length] == eos).any():
            starts.append(s)
    return torch.stack([heldout[s: s + length] for s in starts]).long()


def corpus_tokens(tokenizer: PreTrainedTokenizerFast, recipe: dict, work: Path,
                  texts: tuple[list[str], list[str]] | None = None) -> dict[str, torch.Tensor]:
    """{"train", "heldout"} token streams of the corpus of a `code` recipe, cached in work/tokens.pt for resumes."""
    cache = work / "tokens.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True)
    train_texts, heldout_texts = texts or read_corpus(recipe["include_tests"], recipe["max_files"])
    tokens = {"train": encode(tokenizer, train_texts), "heldout": encode(tokenizer, heldout_texts)}
    with atomic_writer(cache) as f:  # a cache a killed build may resume from: whole or absent
        torch.save(tokens, f)
    return tokens


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    """Build the entry into `dest` (checkpoints in dest/work); returns the zoo.json record."""
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    train_texts, heldout_texts = read_corpus(recipe["include_tests"], recipe["max_files"])
    if not (work / "tokenizer" / "tokenizer.json").is_file():
        train_tokenizer(train_texts, recipe["vocab_size"],
                        recipe["tokenizer_chars"]).save_pretrained(work / "tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")  # fresh or resumed: the same object
    tokens = corpus_tokens(tokenizer, recipe, work, (train_texts, heldout_texts))

    ev = recipe["eval"]
    record = {"corpus": {"train_files": len(train_texts), "heldout_files": len(heldout_texts),
                         "train_tokens": tokens["train"].numel(), "heldout_tokens": tokens["heldout"].numel(),
                         "vocab_size": len(tokenizer)}, "models": {}}
    trained = {}
    for offset, role in enumerate(("target", "draft")):
        model = make_model(recipe[role], tokenizer, recipe["max_positions"], seed + offset)
        config = LMTrainConfig(seed=seed + offset, **recipe[f"{role}_train"])
        losses = train_causal_lm(model, token_windows(tokens["train"], config), config, work / role,
                                 desc=f"code/{role}", progress=progress)
        loss = heldout_loss(model, tokens["heldout"], ev["seq_len"], windows=ev["windows"])
        record["models"][role] = {**save_trained_lm(model, tokenizer, dest / role, losses, config),
                                  "tokens_seen": config.steps * config.batch_size * config.seq_len,
                                  "heldout_loss": loss}
        trained[role] = model
    prompts = heldout_prompts(tokenizer, tokens["heldout"], ev["prompts"], ev["prompt_tokens"])
    record["greedy_agreement"] = greedy_agreement(trained["target"], trained["draft"], prompts, ev["new_tokens"])
    (dest / "prompts.json").write_text(json.dumps(tokenizer.batch_decode(prompts), indent=1))
    return record


@dataclass
class CodeModels:
    target: LlamaForCausalLM
    draft: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    prompts: list[str]


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> CodeModels:
    """Load a built `code` entry exactly as a user's folders would be loaded."""
    kwargs = dict(dtype=dtype, attn_implementation="sdpa")
    target = AutoModelForCausalLM.from_pretrained(path / "target", **kwargs).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(path / "draft", **kwargs).to(device).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "target")
    tokenizer.padding_side = "left"
    return CodeModels(target, draft, tokenizer, json.loads((path / "prompts.json").read_text()))
