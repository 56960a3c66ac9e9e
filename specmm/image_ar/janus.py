"""Janus / Janus-Pro (stock `transformers.JanusForConditionalGeneration`) as an `ImageModel`.

`JanusTarget` does what HF's `generate(..., generation_mode="image")` does, as a guided core target: the doubled
batch [cond; uncond] whose unconditional half keeps only BOS and BOI of the prompt (the rest becomes the pad
token, still attended, as HF does), the stock language model over input embeddings, `generation_head` logits,
`prepare_embeddings_for_image_generation` for every image token fed back, guidance l_u + s (l_c - l_u) before
the shared sampling order. Trees and windows are verified in one forward of the stock language model through
the core `ModelRunner` (4-D masks, explicit positions, ragged rows, left padding); no patched modeling code.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from specmm.core.compiled import StaticPlan
from specmm.core.sampling import SamplingConfig, process_logits, sample_with_noise
from specmm.core.static_cache import sized_plan
from specmm.core.target import FEATURES, ModelRunner, PrefillOutput, TargetOutput
from specmm.core.tree import DraftTree
from specmm.image_ar.images import to_pil
from specmm.image_ar.llamagen.adapter import check_cfg_scale
from specmm.image_ar.llamagen.config import GPTConfig
from specmm.image_ar.models import check_token_ids, refuse_options, register_image_model
from specmm.image_ar.target import cache_rows, combine, pack

CONDITIONING = ("prompt_ids", "prompt_mask", "cfg_scale", "cfg_interval", "max_nodes", "caption_mask")
# generation_config settings whose logits processors HF's image loop would apply and specmm does not reproduce
UNSUPPORTED = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
               "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "sequence_bias": None,
               "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None,
               "begin_suppress_tokens": None, "exponential_decay_length_penalty": None, "min_new_tokens": 0,
               "min_length": 0, "remove_invalid_values": False}


def special_ids(model: nn.Module) -> tuple[int, int, int]:
    """(BOS, BOI, pad) from the model's generation_config, as HF's image loop reads them; ValueError if unset or
    if the config asks for logits processors beyond guidance and the sampling warpers."""
    g = model.generation_config
    boi = (getattr(g, "generation_kwargs", None) or {}).get("boi_token_id")
    for name, value in (("bos_token_id", g.bos_token_id), ("generation_kwargs['boi_token_id']", boi),
                        ("pad_token_id", g.pad_token_id)):
        if not isinstance(value, int):
            raise ValueError(f"generation_config.{name}: Janus image generation needs it (as HF's generate does); "
                             f"got {value!r}")
    for name, off in UNSUPPORTED.items():
        value = getattr(g, name, off)
        if value is not None and value != off:
            raise ValueError(f"generation_config.{name}={value!r}: a logits processor on image tokens specmm does not "
                             "reproduce; unset it")
    return g.bos_token_id, boi, g.pad_token_id


class JanusTarget:
    """A core `Target` over a stock Janus: an empty prompt plus the text prompt (`prompt_ids`, left-padded
    `prompt_mask`) as conditioning; the prefill gives image token 0's guided logits."""

    provides = frozenset({FEATURES})

    def __init__(self, janus: nn.Module):
        self.janus, self.lm = janus, janus.model.language_model  # not `model`: the engine would read its processors
        self.bos, self.boi, self.pad = special_ids(janus)
        self.vocab_size = janus.config.vq_config.num_embeddings
        self.device = next(janus.parameters()).device
        self.tokens_per_image = janus.config.vision_config.num_image_tokens
        self.grid_size = math.isqrt(self.tokens_per_image)
        self.owner: nn.Module = janus  # the module the image parts hang on
        self.runner: ModelRunner | None = None
        self.last_logits: Tensor | None = None
        self.static_plan: StaticPlan | None = None  # set by the engine in compiled mode
        self.guided, self.max_nodes, self.cfg_tensor = False, 1, torch.tensor(1.0)

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        unknown = set(needs) - self.provides
        if unknown:
            raise ValueError(f"drafter: needs {sorted(unknown)} which JanusTarget does not provide")
        self.close()
        self.needs, self.batch, self.last_logits = frozenset(needs), batch, None

    def check_model_inputs(self, model_inputs: dict) -> None:
        unknown = sorted(set(model_inputs) - set(CONDITIONING))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not an input of JanusTarget (takes {', '.join(CONDITIONING)})")
        if "prompt_ids" not in model_inputs:
            raise ValueError("prompt_ids: JanusTarget needs the tokenized text prompt as `prompt_ids`")

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, prompt_ids: Tensor | None = None,
                prompt_mask: Tensor | None = None, cfg_scale: float = 1.0, cfg_interval: int = -1,
                max_nodes: int = 64, caption_mask: Tensor | None = None) -> PrefillOutput:
        """Run the prompt on both guidance halves (HF's first image step); returns the last prompt position's
        packed features [B, 1, F] and image token 0's guided logits [B, V] as `next_logits`."""
        if input_ids.shape[1] != 0 or prompt_ids is None:
            raise ValueError("input_ids: JanusTarget takes an empty [B, 0] prompt plus `prompt_ids`")
        if prompt_ids.shape[0] != self.batch:
            raise ValueError(f"prompt_ids: {prompt_ids.shape[0]} rows for a batch of {self.batch}")
        self.guided, self.max_nodes = cfg_scale > 1.0, max_nodes
        self.cfg_tensor = torch.tensor(float(cfg_scale), device=self.device)
        mask = torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask
        rows = prompt_ids
        if self.guided:  # the unconditional half keeps BOS and BOI, every other prompt token becomes pad
            keep = (prompt_ids == self.bos) | (prompt_ids == self.boi)
            rows = torch.cat([prompt_ids, prompt_ids.masked_fill(~keep, self.pad)])
            mask = cache_rows(mask, True)
        reserve = max(self.static_plan.reserve if self.static_plan else 0, max_nodes + 1)  # one round's nodes
        static = sized_plan(self.static_plan, rows.shape[1] + self.tokens_per_image + reserve)  # prompt, image, round
        self.runner = ModelRunner(self.lm, rows.shape[0], static=static, role="janus")
        embeds = self.janus.get_input_embeddings()(rows)
        hidden = self.runner.extend(mask.bool(), inputs_embeds=embeds).last_hidden_state[:, -1:]  # [R, 1, d]
        logits = combine(self.janus.model.generation_head(hidden), None, self.cfg_tensor, self.guided, -1)
        return PrefillOutput(features=pack(hidden, self.guided), next_logits=logits[:, 0])

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        """Every node after each row's committed tokens, in one forward; logits[:, i] is the guided distribution
        after node i."""
        guided = self.guided
        positions = cache_rows(self.runner.cache.lengths[: tree.tokens.shape[0]][:, None] + tree.depth, guided)
        embeds = self.janus.prepare_embeddings_for_image_generation(cache_rows(tree.tokens, guided))
        out = self.runner.forward(positions, cache_rows(tree.ancestors, guided), inputs_embeds=embeds)
        hidden = out.last_hidden_state  # [R, T, d] (after the final norm, what HF's generation head reads)
        logits = combine(self.janus.model.generation_head(hidden), None, self.cfg_tensor, guided, -1)
        self.last_logits = logits
        return TargetOutput(logits=logits, features=pack(hidden, guided) if FEATURES in self.needs else None)

    def commit(self, path: Tensor, counts: Tensor) -> None:
        self.runner.cache.commit(cache_rows(path, self.guided), cache_rows(counts, self.guided))

    @torch.no_grad()
    def decode(self, token: Tensor, sampling: SamplingConfig, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """One plain step: run token [B], commit it, draw the next (noise [B, V] Exp(1), None when greedy)."""
        zeros = torch.zeros_like(token)[:, None]
        tree = DraftTree(tokens=token[:, None], parents=zeros - 1, depth=zeros, valid=zeros == 0, max_depth=0,
                         max_children=1)
        logits = self.verify(tree).logits[:, 0]
        self.commit(zeros, torch.ones_like(token))
        if sampling.greedy:
            return logits, logits.argmax(-1)
        return logits, sample_with_noise(process_logits(logits, sampling), noise)

    def select_rows(self, rows: Tensor) -> None:
        self.runner.cache.select_rows(torch.cat([rows, rows + self.batch]) if self.guided else rows)
        self.batch = rows.numel()
        if self.last_logits is not None:
            self.last_logits = self.last_logits[rows]


class JanusEmbeddings(nn.Module):
    """Image token ids -> the language model's input embeddings (`prepare_embeddings_for_image_generation`)."""

    def __init__(self, janus: nn.Module):
        super().__init__()
        self.janus = janus

    @property
    def weight(self) -> Tensor:  # device and dtype, as drafters read them off an embedding table
        return self.janus.model.generation_embeddings.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.janus.prepare_embeddings_for_image_generation(tokens)


class JanusImageLM(nn.Module):
    """What an `ImageDrafter` reads of a Janus: a head config (the language model's width and heads, the image
    grid), the image-token embeddings the target feeds back, and `generation_head` as its output."""

    def __init__(self, janus: nn.Module):
        super().__init__()
        text, tokens = janus.config.text_config, janus.config.vision_config.num_image_tokens
        self.config = GPTConfig(dim=text.hidden_size, n_layer=1, n_head=text.num_attention_heads,
                                norm_eps=text.rms_norm_eps, vocab_size=janus.config.vq_config.num_embeddings,
                                block_size=tokens, multiple_of=1)
        self.tok_embeddings = JanusEmbeddings(janus)
        self.head = janus.model.generation_head

    def logits(self, features: Tensor) -> Tensor:
        return self.head(features)


class JanusImageModel:
    """The `ImageModel` of a stock Janus with its processor: text prompts in, PIL images out."""

    compiles = True  # `ImageSampler(compile=True)`: the language model's forwards run compiled over static caches

    def __init__(self, janus: nn.Module, processor=None):
        self.janus, self.processor = janus, processor
        self.target = JanusTarget(janus)
        self.lm = JanusImageLM(janus)
        self.tokens_per_image = self.target.tokens_per_image
        size = janus.model.vqmodel.quantize.quant_state_dims
        if size[0] * size[1] != self.tokens_per_image:
            raise ValueError(f"model: the VQ decodes {size[0]}x{size[1]} tokens but the model generates "
                             f"{self.tokens_per_image} (vision_config.num_image_tokens)")

    def conditioning(self, conditions, cfg_scale: float, max_nodes: int, cfg_interval: int = -1,
                     caption_mask: Tensor | None = None, **options) -> tuple[Tensor, dict]:
        """Text prompts (a string or a list; the processor adds BOI as in `generation_mode="image"`), or processor
        output with `input_ids` / `attention_mask` -> an empty prompt plus the conditioning inputs."""
        refuse_options(options, "Janus")
        check_cfg_scale(cfg_scale)
        if cfg_interval != -1 or caption_mask is not None:
            raise ValueError("cfg_interval / caption_mask: LlamaGen options; Janus guides every image token")
        if isinstance(conditions, str):
            conditions = [conditions]
        if isinstance(conditions, (list, tuple)):
            if not conditions or not all(isinstance(c, str) and c.strip() for c in conditions):
                raise ValueError("conditions: expected non-empty text prompts")
            if self.processor is None:
                raise ValueError("processor: text prompts need the model's JanusProcessor "
                                 "(ImageSampler.for_model(model, processor))")
            conditions = self.processor(text=list(conditions), generation_mode="image", padding=True,
                                        return_tensors="pt")
        ids = conditions.get("input_ids") if hasattr(conditions, "get") else None
        if not isinstance(ids, Tensor):
            raise ValueError("conditions: expected text prompts or processor output with input_ids [B, L]")
        check_token_ids(ids, conditions.get("attention_mask"), "conditions")
        mask = conditions.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        vocab = self.janus.get_input_embeddings().num_embeddings
        if mask.shape != ids.shape or not bool(mask[:, -1].bool().all()):
            raise ValueError("conditions: attention_mask must match input_ids and pad on the left")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"conditions: prompt token ids must be in [0, {vocab})")
        device = self.target.device
        prompt = torch.zeros(ids.shape[0], 0, dtype=torch.long, device=device)
        return prompt, dict(prompt_ids=ids.to(device), prompt_mask=mask.to(device), cfg_scale=cfg_scale,
                            max_nodes=max_nodes)

    @torch.no_grad()
    def hf_generate_problem(self) -> str | None:
        """Why `hf_generate` cannot run under the installed transformers (None when it can)."""
        return stock_generate_problem()

    def hf_generate(self, prompts, cfg_scale: float, **generate_kwargs) -> Tensor:
        """The stock `generate(generation_mode="image")` call this adapter reproduces -> its tokens [B, N]
        (`generate_kwargs`: e.g. `do_sample=False`)."""
        problem = self.hf_generate_problem()
        if problem:
            raise ValueError(f"hf_generate: {problem}")
        _, inputs = self.conditioning(prompts, cfg_scale, max_nodes=1)
        return self.janus.generate(input_ids=inputs["prompt_ids"], attention_mask=inputs["prompt_mask"],
                                   generation_mode="image", guidance_scale=cfg_scale, **generate_kwargs)

    def codebook(self) -> Tensor:
        """The VQ codebook as the decoder reads it (L2-normalised entries)."""
        return F.normalize(self.janus.model.vqmodel.quantize.embedding.weight.detach(), dim=-1)

    def image_tokens(self, sequences: Tensor) -> Tensor:
        return sequences[:, : self.tokens_per_image]

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> list[Image.Image]:
        """VQ decode (`decode_image_tokens`, pixels in [-1, 1]) -> PIL, as Janus's image postprocess does."""
        return to_pil(self.janus.decode_image_tokens(tokens).permute(0, 3, 1, 2))



@functools.cache  # read once: `hf_generate` asks on every call, and benchmarks time those calls
def stock_generate_problem() -> str | None:
    """Why the installed transformers' own Janus image `generate` cannot run, or None when it can. In 5.17 it calls
    `_prepare_static_cache` without the `prefill_chunk_size` that method requires, and raises TypeError."""
    import transformers
    from transformers import JanusForConditionalGeneration
    from transformers.generation.utils import GenerationMixin

    needed = inspect.signature(GenerationMixin._prepare_static_cache).parameters.get("prefill_chunk_size")
    if needed is None or needed.default is not inspect.Parameter.empty:
        return None
    if "prefill_chunk_size" in inspect.getsource(JanusForConditionalGeneration.generate):
        return None
    return (f"transformers {transformers.__version__}'s own Janus image generate fails (it calls "
            "_prepare_static_cache without prefill_chunk_size), so there is no stock reference to compare with; "
            "use transformers >= 5.24")

register_image_model("JanusForConditionalGeneration", JanusImageModel)

__all__ = ["JanusImageLM", "JanusImageModel", "JanusTarget", "stock_generate_problem"]
