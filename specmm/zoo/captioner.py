"""Zoo entry `captioner`: a LLaVA (small CLIP vision tower + Llama LM) that describes procedural scenes.

Stock `LlavaForConditionalGeneration` with a real `LlavaProcessor` (CLIP image processor + a byte-level BPE
tokenizer with an `<image>` token), trained from scratch on scenes drawn on the fly; plus a text-only Llama
draft with the same vocabulary for baselines. Quality is the precision/recall of the facts parsed back out
of greedy captions of held-out scenes.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from specmm.zoo import scenes
from specmm.zoo.lm_training import (
    GPU_TRAINING_EAGER,
    IGNORE,
    LMTrainConfig,
    next_token_loss,
    save_trained_lm,
    train_causal_lm,
)

EOS, PAD, IMAGE = "<|endoftext|>", "<pad>", "<image>"
PROMPT = "<image>\nDescribe the picture in detail.\n"
# the processor's chat template renders one user turn (image, instruction) as PROMPT: the training format, which
# `specmm caption` and `caption_prompt` then use by default
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}{{ '\\n' }}"
                 "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>{{ '\\n' }}"
                 "{% elif part['type'] == 'text' %}{{ part['text'] }}{{ '\\n' }}{% endif %}{% endfor %}{% endif %}"
                 "{% endfor %}")
HELDOUT_SEED = 10**9  # held-out scenes come from seeds no training step uses

RECIPES = {
    "tiny": dict(aux_weight=1.0, image_size=48, patch_size=16, vocab_size=512, tokenizer_captions=300,
                 vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2),
                 text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1),
                 draft=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                            num_key_value_heads=1),
                 target_train=dict(steps=4, batch_size=2, seq_len=0, checkpoint_every=2, warmup_steps=1),
                 draft_train=dict(steps=4, batch_size=2, seq_len=0, checkpoint_every=2, warmup_steps=1),
                 eval=dict(scenes=2, max_new_tokens=24)),
    "cpu": dict(aux_weight=1.0, image_size=96, patch_size=32, vocab_size=512, tokenizer_captions=20_000,
                vision=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=8),
                text=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                          num_key_value_heads=3),
                draft=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2),
                target_train=dict(steps=2300, batch_size=8, seq_len=0, lr=1.5e-3, warmup_steps=50,
                                  checkpoint_every=100),
                draft_train=dict(steps=600, batch_size=16, seq_len=0, lr=3e-3, warmup_steps=30,
                                 checkpoint_every=100),
                eval=dict(scenes=64, max_new_tokens=220)),
    # the `vlm` step on one H100 (untested: no GPU run yet): LLaVA target ~95M params (12-layer 768-wide Llama +
    # 6-layer ViT), 3000 steps x 64 captions of ~250 tokens = 48M tokens: 6 x 95M x 48M = 2.7e16 FLOPs, ~1.2 min at
    # 400 TFLOP/s; bf16 autocast and fused AdamW, eager (the LLaVA forward with image features is not compiled here).
    # NOT yet within budget: captioner-drafters trains its five drafters with the drafter trainer, which has no
    # CUDA path yet (it trains where the captioner is loaded, on the CPU).
    "gpu": dict(aux_weight=1.0, image_size=192, patch_size=32, vocab_size=1024, tokenizer_captions=50_000,
                vision=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6),
                text=dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                          num_key_value_heads=4),
                draft=dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4),
                target_train=dict(steps=3000, batch_size=64, seq_len=0, lr=6e-4, warmup_steps=200,
                                  checkpoint_every=250, **GPU_TRAINING_EAGER),
                draft_train=dict(steps=1500, batch_size=64, seq_len=0, lr=2e-3, warmup_steps=100,
                                 checkpoint_every=250, **GPU_TRAINING_EAGER),
                eval=dict(scenes=256, max_new_tokens=220)),
}
# ViSpec's case on the CPU: the `cpu` captioner with 8 px patches, so an image is 144 tokens instead of 9 (a one-layer
# drafter then attends over more image than caption, as with LLaVA's 576); same text model and steps
RECIPES["cpu-long"] = {**copy.deepcopy(RECIPES["cpu"]), "patch_size": 8}


def scene_and_caption(seed: int) -> tuple[scenes.Scene, str]:
    rng = random.Random(seed)
    scene = scenes.random_scene(rng)
    return scene, scenes.describe(scene, rng)


def train_tokenizer(vocab_size: int, captions: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD, IMAGE],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [PROMPT] + [scene_and_caption(-1 - i)[1] for i in range(captions)]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=PAD,
                                   extra_special_tokens={"image_token": IMAGE}, model_max_length=1 << 16)


def make_processor(tokenizer: PreTrainedTokenizerFast, recipe: dict) -> LlavaProcessor:
    size = recipe["image_size"]
    image_processor = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=recipe["patch_size"],
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE)


def make_target(recipe: dict, tokenizer, seed: int) -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(image_size=recipe["image_size"], patch_size=recipe["patch_size"], **recipe["vision"])
    text = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True,
                       bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, **recipe["text"])
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
                         vision_feature_select_strategy="default", vision_feature_layer=-1,
                         projector_hidden_act="gelu")
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config)


def make_draft(recipe: dict, tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **recipe["draft"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


ATTRIBUTES = {"shape": ("empty", *scenes.SHAPES), "colour": ("empty", *scenes.COLOURS),
              "size": ("empty", *scenes.SIZES), "texture": ("empty", *scenes.TEXTURES),
              "row": scenes.ROWS, "column": scenes.COLUMNS}


def cell_labels(scene: scenes.Scene, patches_per_side: int = 3) -> torch.Tensor:
    """[P, 6] per image patch (P = patches_per_side^2, row-major): the shape, colour, size and texture of the
    object in the patch's scene cell (0 = empty cell), then that cell's row and column. A patch grid finer than
    the 3x3 scene grid (a multiple of 3 per side) labels every patch of a cell with the cell's object."""
    if patches_per_side % 3:
        raise ValueError(f"patches_per_side must be a multiple of the scene grid (3), got {patches_per_side}")
    cell_labels_3x3 = torch.zeros(9, len(ATTRIBUTES), dtype=torch.long)
    cell_labels_3x3[:, 4] = torch.arange(9) // 3
    cell_labels_3x3[:, 5] = torch.arange(9) % 3
    for obj in scene.objects:
        cell = obj.cell[0] * 3 + obj.cell[1]
        for j, name in enumerate(("shape", "colour", "size", "texture")):
            cell_labels_3x3[cell, j] = ATTRIBUTES[name].index(getattr(obj, name))
    cell_of_patch = torch.arange(patches_per_side) * 3 // patches_per_side  # [side] scene row/column of a patch
    return cell_labels_3x3[(cell_of_patch[:, None] * 3 + cell_of_patch[None, :]).flatten()]


class CaptionerTraining(nn.Module):
    """LLaVA plus an auxiliary loss that teaches it to see in a CPU budget: each image token, once projected
    into the LM, must score its cell's attribute words and its row and column words (by dot product with
    their tied word embeddings) above the alternatives. Image tokens then sit near the words that describe
    and locate them, so the LM finds the right token by content and copies, instead of having to discover
    the mapping. Only `llava` is saved.
    """

    def __init__(self, llava: LlavaForConditionalGeneration, tokenizer, aux_weight: float):
        super().__init__()
        self.llava = llava
        self.aux_weight = aux_weight
        word_ids = [[tokenizer.encode(" " + _first_word(name, c), add_special_tokens=False)[0] for c in classes]
                    for name, classes in ATTRIBUTES.items()]
        for name, ids in zip(ATTRIBUTES, word_ids):
            if len(set(ids)) != len(ids):
                raise ValueError(f"tokenizer: the {name} words do not start with distinct tokens")
        self.register_buffer("word_ids", torch.tensor(sum(word_ids, [])), persistent=False)
        self.groups = [len(classes) for classes in ATTRIBUTES.values()]
        # plain linear heads on the vision features: the tower learns to see fast, the projector then aligns
        self.vision_heads = nn.Linear(llava.config.vision_config.hidden_size, sum(self.groups))

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cells = batch["cell_labels"]  # [B, P, 6] per image patch
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "cell_labels")}
        caption_loss = next_token_loss(self.llava(**inputs).logits, batch["labels"])
        model = self.llava.model
        vision = model.vision_tower(batch["pixel_values"], output_hidden_states=True).hidden_states[-1][:, 1:]
        projected = model.multi_modal_projector(vision)  # [B, P, H] image tokens as the LM sees them
        tied = projected @ self.llava.get_input_embeddings()(self.word_ids).T  # [B, P, sum(classes)]
        aux = sum(self._grouped_loss(scores, cells) for scores in (tied, self.vision_heads(vision)))
        return caption_loss + self.aux_weight * aux

    def _grouped_loss(self, scores: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        groups = scores.split(self.groups, dim=-1)
        losses = [F.cross_entropy(g.flatten(0, 1), cells[..., j].flatten()) for j, g in enumerate(groups)]
        return sum(losses) / len(groups)


def _first_word(attribute: str, value: str) -> str:
    words = {"size": scenes.SIZE_WORDS, "texture": scenes.TEXTURE_WORDS}.get(attribute)
    if value == "empty":
        return "empty"
    return words[value][0].split("-")[0] if words else value


def caption_batches(processor: LlavaProcessor, recipe: dict, config: LMTrainConfig, with_images: bool):
    """make_batch(step): scenes drawn for (seed, step); loss only on caption tokens and the final EOS."""
    tokenizer = processor.tokenizer
    size = recipe["image_size"]

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        seeds = [(config.seed * 1_000_003 + step) * 64 + i for i in range(config.batch_size)]
        pairs = [scene_and_caption(s) for s in seeds]
        texts = [PROMPT + caption + EOS for _, caption in pairs]
        images = [scenes.render(scene, size, seed=s) for (scene, _), s in zip(pairs, seeds)]
        tokenizer.padding_side = "right"
        enc = processor(images=images, text=texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        prompt_len = len(processor(images=images[:1], text=[PROMPT])["input_ids"][0])
        labels[:, :prompt_len] = IGNORE
        labels[enc["attention_mask"] == 0] = IGNORE
        batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}
        if with_images:
            batch["pixel_values"] = enc["pixel_values"]
            side = recipe["image_size"] // recipe["patch_size"]
            batch["cell_labels"] = torch.stack([cell_labels(scene, side) for scene, _ in pairs])
        return batch

    return make_batch


@torch.no_grad()
def caption_scenes(model, processor, seeds: list[int], size: int, max_new_tokens: int, batch_size: int = 16
                   ) -> list[str]:
    """Greedy captions of the scenes with these seeds."""
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    captions = []
    for i in range(0, len(seeds), batch_size):
        chunk = seeds[i: i + batch_size]
        images = [scenes.render(scene_and_caption(s)[0], size, seed=s) for s in chunk]
        enc = processor(images=images, text=[PROMPT] * len(chunk), return_tensors="pt", padding=True).to(model.device)
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        captions += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return captions


def evaluate(model, processor, recipe: dict) -> dict:
    """Mean fact precision / recall / relation accuracy of greedy captions of held-out scenes."""
    ev = recipe["eval"]
    seeds = [HELDOUT_SEED + i for i in range(ev["scenes"])]
    captions = caption_scenes(model, processor, seeds, recipe["image_size"], ev["max_new_tokens"])
    scores = [scenes.fact_scores(c, scene_and_caption(s)[0]) for c, s in zip(captions, seeds)]
    n = len(scores)
    return {"scenes": n, "fact_precision": sum(s[0] for s in scores) / n, "fact_recall": sum(s[1] for s in scores) / n,
            "relation_accuracy": sum(s[2] for s in scores) / n, "example": {"seed": seeds[0], "caption": captions[0]}}


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "tokenizer" / "tokenizer.json").is_file():
        train_tokenizer(recipe["vocab_size"], recipe["tokenizer_captions"]).save_pretrained(work / "tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")
    processor = make_processor(tokenizer, recipe)
    record = {"models": {}}
    for offset, role in enumerate(("target", "draft")):
        config = LMTrainConfig(seed=seed + offset, **recipe[f"{role}_train"])
        batches = caption_batches(processor, recipe, config, with_images=role == "target")
        if role == "target":
            training = CaptionerTraining(make_target(recipe, tokenizer, seed), tokenizer, recipe["aux_weight"])
            losses = train_causal_lm(training, batches, config, work / role, desc="captioner/target",
                                     progress=progress, loss_fn=lambda m, b: m.loss(b))
            model = training.llava
        else:
            model = make_draft(recipe, tokenizer, seed + 1)
            losses = train_causal_lm(model, batches, config, work / role, desc="captioner/draft", progress=progress)
        record["models"][role] = save_trained_lm(model, tokenizer, dest / role, losses, config,
                                                 files=processor if role == "target" else tokenizer)
        if role == "target":
            record["quality"] = evaluate(model, processor, recipe)
    record["image_tokens"] = (recipe["image_size"] // recipe["patch_size"]) ** 2
    (dest / "heldout.json").write_text(json.dumps({"seeds": [HELDOUT_SEED + i for i in range(recipe["eval"]["scenes"])],
                                                   "prompt": PROMPT, "image_size": recipe["image_size"]}))
    return record


@dataclass
class CaptionerModels:
    target: LlavaForConditionalGeneration
    draft: LlamaForCausalLM
    processor: LlavaProcessor
    image_size: int


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> CaptionerModels:
    kwargs = dict(dtype=dtype, attn_implementation="sdpa")
    target = LlavaForConditionalGeneration.from_pretrained(path / "target", **kwargs).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(path / "draft", **kwargs).to(device).eval()
    processor = LlavaProcessor.from_pretrained(path / "target")
    return CaptionerModels(target, draft, processor, json.loads((path / "heldout.json").read_text())["image_size"])
