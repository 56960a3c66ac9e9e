"""Emu3 image generation as a guided core target: what HF's `generate` does with the docs' per-position
`prefix_allowed_tokens_fn` and guidance against a negative prompt, verified a tree at a time.

HF's order per step: the cond logits (a float32 copy) and the uncond logits (the negative prompt's own forward,
positions counted over its padded length) are log-softmaxed and mixed as u + s (c - u)
(`UnbatchedClassifierFreeGuidanceLogitsProcessor`), then the prefix constraint adds -inf outside the allowed
tokens, then the sampling warpers. The constraint depends only on a token's offset after the prompt's
`<|image token|>` (`forced_token`): end-of-line at every (width + 1)-th offset, end-of-frame, end-of-image and EOS
after the last row, visual tokens everywhere else.

Every token the constraint allows besides the visual ones is forced (probability one), so the target's vocabulary
is the K visual codes: each tree node is a code scored over the visual columns of the guided scores, and a node
that ends a latent row gets its end-of-line run right after it, at its own position, in the same forward (the
logits after the row end are read there). The sampled codes, with the forced tokens put back
(`Emu3Target.sequences`), are what `generate` returns, with the same probability. Both guidance halves run in one
forward of the stock model over a `ModelRunner` (4-D tree masks, explicit positions); no patched modeling code.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from specmm.core.compiled import StaticPlan
from specmm.core.limits import check_position_scheme
from specmm.core.processors import TreeLogitsProcessor
from specmm.core.sampling import SamplingConfig, process_logits, sample_with_noise
from specmm.core.target import (
    FEATURES,
    ModelRunner,
    PrefillOutput,
    TargetOutput,
    attention_backend,
    final_norm,
    model_device,
)
from specmm.core.static_cache import sized_plan
from specmm.core.tree import DraftTree

CONDITIONING = ("prompt_ids", "prompt_mask", "negative_prompt_ids", "negative_prompt_attention_mask",
                "guidance_scale", "max_nodes")


@dataclass(frozen=True)
class Emu3Vocabulary:
    """The model ids of an Emu3 checkpoint's visual codes, forced tokens and prompt markers."""

    visual: Tensor  # [K] model id of each VQ code
    forced: dict[str, int]  # model ids of 'eol', 'eof', 'eoi', 'eos', 'pad'
    boi: int  # <|image start|>
    wrapper: int  # <|image token|>, the prompt's last token
    strings: dict[int, str]  # model id -> token string (to read H*W from a prompt)

    @classmethod
    def of(cls, model: nn.Module, processor=None) -> Emu3Vocabulary:
        """From the model's `vocabulary_map` (the tokenizer's vocabulary) and text config; a processor's tokenizer,
        when given, supplies the ids the HF docs' constraint function reads."""
        vocab = model.config.vocabulary_map or {}
        text = model.config.get_text_config()
        tok = getattr(processor, "tokenizer", None)

        def special(attribute: str | None, name: str | None, fallback: int | None = None) -> int:
            found = getattr(tok, attribute, None) if tok is not None and attribute else None
            found = found if found is not None else (vocab.get(name) if name else None)
            found = found if found is not None else fallback
            if found is None:
                raise ValueError(f"model: {type(model).__name__} has no {name or attribute} token in its vocabulary")
            return int(found)

        codes = {int(name[-8:-2]): i for name, i in vocab.items() if name.startswith("<|visual token")}
        if not codes or sorted(codes) != list(range(len(codes))):
            raise ValueError("model: the vocabulary_map must hold visual tokens '<|visual token NNNNNN|>' for codes "
                             f"0..K-1 (found {len(codes)})")
        eos = text.eos_token_id[0] if isinstance(text.eos_token_id, list) else text.eos_token_id
        forced = {"eol": special(None, "<|extra_200|>"), "eof": special("eof_token_id", "<|extra_201|>"),
                  "eoi": special("eoi_token_id", "<|image end|>"), "eos": special("eos_token_id", None, eos),
                  "pad": special("pad_token_id", None, text.pad_token_id)}
        return cls(visual=torch.tensor([codes[c] for c in range(len(codes))]), forced=forced,
                   boi=special("boi_token_id", "<|image start|>"),
                   wrapper=special("image_wrapper_token_id", "<|image token|>"),
                   strings={i: name for name, i in vocab.items()})

    def image_size(self, prompt: list[int]) -> tuple[int, int]:
        """(height, width) from a prompt that ends with <|image start|>H*W<|image token|> (valid tokens only)."""
        if not prompt or prompt[-1] != self.wrapper or prompt.count(self.wrapper) != 1:
            raise ValueError("prompt_ids: each prompt must end with the one <|image token|> of an image-generation "
                             "prompt (Emu3Processor(..., return_for_image_generation=True) writes it)")
        start = len(prompt) - 1 - prompt[::-1].index(self.boi) if self.boi in prompt else -1
        text = "".join(self.strings.get(i, "?") for i in prompt[start + 1:-1])
        match = re.fullmatch(r"(\d+)\*(\d+)", text)
        if start < 0 or match is None:
            raise ValueError(f"prompt_ids: expected <|image start|>H*W<|image token|> at the end, got {text!r}")
        return int(match.group(1)), int(match.group(2))


def forced_token(offset: int, height: int, width: int) -> str | None:
    """The token the HF docs' `prefix_allowed_tokens_fn` forces at `offset` after the prompt's <|image token|>
    (1 = the first image token), in its order of checks; None where it allows the visual tokens."""
    line, end = width + 1, (width + 1) * height
    if offset % line == 0:
        return "eol"
    named = {end + 1: "eof", end + 2: "eoi", end + 3: "eos"}
    return named.get(offset, "pad" if offset > end + 3 else None)


class Emu3Target:
    """A core `Target` over a stock `Emu3ForConditionalGeneration`, for images of `height` x `width` latent tokens
    (tokens: the K VQ codes; `sequences` puts the forced tokens back).

    Its prompt is all conditioning: the engine gets `input_ids` of shape [B, 0] and the model inputs `prompt_ids`
    / `prompt_mask` (left-padded image-generation prompts), `negative_prompt_ids` / `negative_prompt_attention_mask`
    (as HF's `generate`; None: the prompt's last token, as HF), `guidance_scale` and `max_nodes`. In compiled mode
    (`static_plan` set by the engine) the model's forwards run compiled over a static cache sized here."""

    provides = frozenset({FEATURES})

    def __init__(self, model: nn.Module, height: int, width: int, vocab: Emu3Vocabulary | None = None):
        if type(model).__name__ != "Emu3ForConditionalGeneration":
            raise ValueError(f"model: expected an Emu3ForConditionalGeneration, got {type(model).__name__}")
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive number of latent tokens, got {value!r}")
        attention_backend(model)
        check_position_scheme(model, "target")
        self.emu3, self.owner = model, model  # not `model`: the engine would read its text generation_config
        self.vocab = vocab or Emu3Vocabulary.of(model)
        self.height, self.width = height, width
        self.grid_size, self.tokens_per_image = width, height * width  # codes per latent row, per image
        self.vocab_size = len(self.vocab.visual)
        self.device = model_device(model)
        self.visual = self.vocab.visual.to(self.device)
        self.static_plan: StaticPlan | None = None
        self.last_logits: Tensor | None = None  # [B, T, K] processed scores of the last verify (Jacobi reads them)
        self.runner: ModelRunner | None = None
        self.needs: frozenset[str] = frozenset()

    def sequences(self, codes: Tensor) -> Tensor:
        """Codes [B, H*W] -> the model ids `generate` returns after the prompt: each latent row, its end-of-line,
        then the tokens forced after the image (EOF, EOI, EOS), [B, (W + 1) * H + 3]."""
        rows = self.vocab.visual.to(codes.device)[codes].view(-1, self.height, self.width)
        eol = rows.new_full((*rows.shape[:2], 1), self.vocab.forced["eol"])
        end = (self.width + 1) * self.height
        tail = [self.vocab.forced[forced_token(end + i, self.height, self.width)] for i in (1, 2, 3)]
        return torch.cat([torch.cat([rows, eol], -1).flatten(1), rows.new_tensor(tail).expand(rows.shape[0], 3)], 1)

    def codes(self, sequences: Tensor) -> Tensor:
        """The inverse of `sequences`: the model ids `generate` returns after the prompt [B, >= (W + 1) * H] ->
        codes [B, H*W]; ValueError where a latent row holds an id that is no visual token."""
        rows = sequences[:, : (self.width + 1) * self.height].reshape(-1, self.height, self.width + 1)
        code_of = torch.full((max(int(sequences.max()), int(self.visual.max())) + 1,), -1, dtype=torch.long,
                             device=sequences.device)
        code_of[self.visual.to(sequences.device)] = torch.arange(self.vocab_size, device=sequences.device)
        codes = code_of[rows[..., : self.width]].flatten(1)
        if bool((codes < 0).any()):
            raise ValueError("sequences: a latent row holds a token that is no visual code")
        return codes

    def allowed_tokens(self):
        """The HF docs' `prefix_allowed_tokens_fn` for this image size (`generate(prefix_allowed_tokens_fn=...)`):
        at each offset after the prompt's <|image token|>, the token `forced_token` names, else every visual code."""
        visual, forced, wrapper = self.vocab.visual.tolist(), self.vocab.forced, self.vocab.wrapper
        height, width = self.height, self.width

        def allowed(batch_id: int, input_ids: Tensor) -> list[int]:
            start = int(torch.nonzero(input_ids == wrapper)[0, 0])
            name = forced_token(input_ids.shape[0] - start, height, width)
            return visual if name is None else [forced[name]]

        return allowed

    # ------------------------------------------------------------------ setup
    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        unknown = set(needs) - self.provides
        if unknown:
            raise ValueError(f"drafter: needs {sorted(unknown)} which Emu3Target does not provide")
        self.close()
        self.needs, self.batch, self.last_logits = frozenset(needs), batch, None

    def check_model_inputs(self, model_inputs: dict) -> None:
        unknown = sorted(set(model_inputs) - set(CONDITIONING))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not an input of Emu3Target (takes {', '.join(CONDITIONING)})")
        if model_inputs.get("prompt_ids") is None:
            raise ValueError("prompt_ids: Emu3Target needs the image-generation prompts as `prompt_ids`")
        config = copy.copy(getattr(self.emu3, "generation_config", None))
        if config is not None:  # guidance is this target's own; any other processor would change the order
            config.guidance_scale = None
            if TreeLogitsProcessor.from_model(SimpleNamespace(generation_config=config)) is not None:
                raise ValueError("generation_config: sets logits processors (repetition penalty, n-gram bans, "
                                 "suppressed tokens, ...) that Emu3Target does not apply; unset them on the model")

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, prompt_ids: Tensor | None = None,
                prompt_mask: Tensor | None = None, negative_prompt_ids: Tensor | None = None,
                negative_prompt_attention_mask: Tensor | None = None, guidance_scale: float | None = None,
                max_nodes: int = 64) -> PrefillOutput:
        """Prefill the prompts of both guidance halves; returns the processed scores [B, K] of image token 0 as
        `next_logits` and the features [B, 1, F] of the prompt's last position."""
        if input_ids.shape[1] != 0 or prompt_ids is None:
            raise ValueError("input_ids: Emu3Target takes an empty [B, 0] prompt plus `prompt_ids`")
        prompt, prompt_mask = self._check_prompt(prompt_ids, prompt_mask, "prompt_ids", "prompt_mask")
        self.guided = guidance_scale is not None and guidance_scale != 1
        self.guidance_scale = float(guidance_scale) if self.guided else 1.0
        self.cfg_tensor = torch.tensor(self.guidance_scale, device=self.device)  # the drafter's guidance
        self.max_nodes = max_nodes
        ids, valid, positions = [prompt], [prompt_mask], [(prompt_mask.cumsum(1) - 1).clamp_min(0)]
        if self.guided:  # HF's unconditional forward passes no position ids: pads count as positions
            if negative_prompt_ids is None:
                negative_prompt_ids = prompt[:, -1:]
            negative, negative_mask = self._check_prompt(negative_prompt_ids, negative_prompt_attention_mask,
                                                         "negative_prompt_ids", "negative_prompt_attention_mask",
                                                         image_prompt=False)
            ids.append(negative)
            valid.append(negative_mask)
            positions.append(torch.arange(negative.shape[1], device=self.device).expand_as(negative))
        width = max(x.shape[1] for x in ids)
        ids, valid, positions = (torch.cat([nn.functional.pad(x, (width - x.shape[1], 0)) for x in xs])
                                 for xs in (ids, valid, positions))
        capture = final_norm(self.emu3) if FEATURES in self.needs else None
        # slots for the prompt, the image with its ends of line (and EOF, EOI, EOS), and one round of code and
        # end-of-line nodes
        reserve = 2 * max(self.static_plan.reserve if self.static_plan else 0, max_nodes + 1)
        static = sized_plan(self.static_plan, ids.shape[1] + (self.width + 1) * self.height + 3 + reserve)
        self.runner = ModelRunner(self.emu3, ids.shape[0], capture=capture, static=static, role="emu3")
        out = self.runner.extend(valid.bool(), positions, input_ids=ids, logits_to_keep=1)
        # position of image token 0 per cache row: after the valid prompt (cond), after the padded one (uncond)
        starts = [prompt_mask.sum(1)] + ([torch.full_like(prompt_mask[:, 0], negative.shape[1])] if self.guided else [])
        self.first_position = torch.cat(starts)  # [R]
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=self.device)  # [B] committed codes
        features = self._pack(self.runner.captured[:, -1:]) if capture is not None else None
        return PrefillOutput(features=features, next_logits=self._scores(out.logits)[:, 0])

    def _check_prompt(self, ids: Tensor, mask: Tensor | None, name: str, mask_name: str,
                      image_prompt: bool = True) -> tuple[Tensor, Tensor]:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] != self.batch or ids.shape[1] == 0:
            shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"{name}: expected a [{self.batch}, L] tensor of token ids, got {shape}")
        mask = torch.ones_like(ids) if mask is None else mask
        if not isinstance(mask, Tensor) or mask.shape != ids.shape or not bool(mask[:, -1].bool().all()):
            raise ValueError(f"{mask_name}: expected the shape of {name} with ones in the last column (left padding)")
        if int(ids.min()) < 0 or int(ids.max()) >= self.emu3.config.get_text_config().vocab_size:
            raise ValueError(f"{name}: token ids outside the model's vocabulary")
        if image_prompt:
            for row, (tokens, keep) in enumerate(zip(ids.tolist(), mask.bool().tolist())):
                size = self.vocab.image_size([t for t, k in zip(tokens, keep) if k])
                if size != (self.height, self.width):
                    raise ValueError(f"{name}: row {row} asks for a {size[0]}x{size[1]} image, this target makes "
                                     f"{self.height}x{self.width}")
        return ids.to(self.device).long(), mask.to(self.device).long()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    # ------------------------------------------------------------------ rounds
    def _rows(self, x: Tensor) -> Tensor:
        """Per-row values [B, ...] -> cache rows [R, ...] (both guidance halves)."""
        return torch.cat([x, x]) if self.guided else x

    def _pack(self, features: Tensor) -> Tensor:
        """[R, n, d] -> [B, n, F]: cond and uncond features side by side (F = 2d when guided)."""
        return torch.cat(features.chunk(2), -1) if self.guided else features

    def _scores(self, logits: Tensor) -> Tensor:
        """Model logits [R, n, V_model] before a visual token -> processed scores [B, n, K]: guidance on the
        log-softmaxed halves (cond as a float32 copy, as `generate`), then the constraint (visual tokens only; HF
        gives a row whose allowed scores are all -inf the bare mask)."""
        batch = logits.shape[0] // 2 if self.guided else logits.shape[0]
        scores = logits[:batch].float()
        if self.guided:
            cond, uncond = scores.log_softmax(-1), logits[batch:].log_softmax(-1)
            scores = self.guidance_scale * (cond - uncond) + uncond
        scores = scores[..., self.visual]
        return torch.where(scores.amax(-1, keepdim=True).isneginf(), torch.zeros_like(scores), scores)

    def _forward(self, tokens: Tensor, depth: Tensor, ancestors: Tensor) -> tuple[Tensor, Tensor | None]:
        """Run code nodes [B, T] at code index lengths + depth, each row end followed by its end-of-line node (slots
        T..2T-1), over both halves -> scores [B, T, K] after each node (and its features)."""
        batch, nodes = tokens.shape
        index = self.lengths[:, None] + depth  # [B, T] code index
        row_end = (index + 1) % self.width == 0  # the node's next token is a forced end-of-line
        self._row_end = row_end
        code_positions = index + index // self.width  # [B, T] place after the prompt (ends of line included)
        positions = self.first_position[:, None] + self._rows(torch.cat([code_positions, code_positions + 1], 1))
        eye = torch.eye(nodes, dtype=torch.bool, device=tokens.device).expand(batch, -1, -1)
        lines = ancestors & row_end[:, None, :] & ~eye  # [B, T, T] the ends of line before each node on its path
        live = row_end[:, :, None]  # an end-of-line node that follows no row end is junk: it sees only itself
        attend = torch.cat([torch.cat([ancestors, lines], 2),  # a code: its path and the lines ended on it
                            torch.cat([ancestors & live, (lines & live) | eye], 2)], 1)  # an end of line: its code's
        inputs = torch.cat([self.visual[tokens], torch.full_like(tokens, self.vocab.forced["eol"])], 1)
        out = self.runner.forward(positions, self._rows(attend), input_ids=self._rows(inputs))
        pick = self._rows(row_end)[:, :, None]  # after a row end the next code is predicted by its end of line
        logits = torch.where(pick, out.logits[:, nodes:], out.logits[:, :nodes])
        features = None
        if FEATURES in self.needs:
            captured = self.runner.captured
            features = self._pack(torch.where(pick, captured[:, nodes:], captured[:, :nodes]))
        return self._scores(logits), features

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        """Run every node after each row's committed codes; logits[:, i] scores the code after node i."""
        scores, features = self._forward(tree.tokens, tree.depth, tree.ancestors)
        self.last_logits = scores
        return TargetOutput(logits=scores, features=features)

    @torch.no_grad()
    def decode(self, token: Tensor, sampling: SamplingConfig, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """One plain decoding step: run code [B], commit it, draw the next with `noise` [B, K] (Exp(1) draws; None
        when greedy). Returns the scores [B, K] and the next code [B]."""
        zeros = torch.zeros_like(token)[:, None]
        scores, _ = self._forward(token[:, None], zeros, torch.ones_like(zeros, dtype=torch.bool)[:, :, None])
        self.commit(zeros, torch.ones_like(token))
        scores = scores[:, 0]
        if sampling.greedy:
            return scores, scores.argmax(-1)
        return scores, sample_with_noise(process_logits(scores, sampling), noise)

    def commit(self, path: Tensor, counts: Tensor) -> None:
        """Keep nodes `path[b, :counts[b]]` of the last forward, each row end with its end-of-line, on both halves."""
        nodes = self._row_end.shape[1]
        steps = torch.arange(path.shape[1], device=path.device)
        kept = steps[None, :] < counts[:, None]  # [B, D+1]
        with_eol = kept & self._row_end.gather(1, path)
        slots = torch.stack([path, path + nodes], 2).flatten(1)  # [B, 2(D+1)] code slot, then its end-of-line slot
        valid = torch.stack([kept, with_eol], 2).flatten(1)
        order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # kept slots first, in order
        self.runner.cache.commit(self._rows(slots.gather(1, order)), self._rows(valid.sum(1)))
        self.lengths = self.lengths + counts

    def select_rows(self, rows: Tensor) -> None:
        kept = torch.cat([rows, rows + self.batch]) if self.guided else rows
        self.runner.cache.select_rows(kept)
        self.first_position = self.first_position[kept]
        self.lengths = self.lengths[rows]
        self.batch = rows.numel()
        if self.last_logits is not None:
            self.last_logits = self.last_logits[rows]
