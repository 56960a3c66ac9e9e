"""ImageSampler: conditional image sampling with a proposer and an acceptance rule, for any `ImageModel`
(LlamaGen; stock generators through `ImageSampler.for_model`, e.g. Janus-Pro).

The core `SpeculativeGenerator` runs everything through its public round step: the guided target's conditioning
prefill gives image token 0, then rounds of draft -> verify -> accept (ragged rows, per-row generators).
`proposer="ar"` is the plain one-token-per-forward baseline. `compile=True` is the fast path for every proposer:
the verify, commit, draft and acceptance parts run compiled with static shapes over LlamaGen's own static caches
(`specmm.image_ar.compiled`; Janus and Emu3: the stock model's forwards over the core's static cache), rows stay in
the batch until all are done, and a round makes one host sync. Every round after the first (the first two when
sampling: their draws go on a `DrawTape`) runs as one compiled graph."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from PIL import Image
from torch import Tensor

from specmm.core.acceptance import AcceptanceRule
from specmm.core.compiled import CompileClock
from specmm.core.engine import SpeculativeGenerator, synchronize
from specmm.core.sampling import Generators, SamplingConfig
from specmm.core.stats import GenerationStats, ImageExtras
from specmm.core.tree import TreeSpec
from specmm.image_ar.acceptance import GSD, SJD, Exact, Lantern
from specmm.image_ar.autoregressive import generate_ar
from specmm.image_ar.compiled import image_plan
from specmm.image_ar.drafter import ImageDrafter
from specmm.image_ar.jacobi import JacobiProposer
from specmm.image_ar.llamagen.model import LlamaGen
from specmm.image_ar.models import ImageModel, image_model_for

RULES = {"exact": Exact, "sjd": SJD}
DRAFTER_TREE = TreeSpec.dynamic(depth=4, top_k=4, total_tokens=16)  # a drafter's tree unless one is given


@dataclass
class ImageSample:
    images: list[Image.Image]
    tokens: Tensor  # [B, N] image tokens (raster order)
    stats: GenerationStats = field(default_factory=GenerationStats)


class ImageSampler:
    """Sample images from an image model (a LlamaGen or an `ImageModel`; stock models: `for_model`) with `proposer`
    ('ar' | 'jacobi' | an ImageDrafter) and `acceptance` ('exact' | 'sjd' | a rule object such as Lantern,
    LanternPP, GSD); `compile=True` for the compiled fast path (the same tokens; the first call of each batch
    size, window or tree compiles)."""

    def __init__(self, lg: LlamaGen | ImageModel, proposer: str | ImageDrafter = "jacobi",
                 acceptance: str | AcceptanceRule = "exact", tree: TreeSpec | None = None, window: int = 16,
                 init: str = "random", cfg_interval: int = -1, compile: bool = False, profile: bool = False):
        if not isinstance(lg, LlamaGen) and (isinstance(lg, torch.nn.Module) or not isinstance(lg, ImageModel)):
            raise ValueError(f"lg: expected a LlamaGen or an ImageModel (stock models: ImageSampler.for_model), "
                             f"got {type(lg).__name__}")
        self.model: ImageModel = image_model_for(lg)
        self.lg = lg if isinstance(lg, LlamaGen) else None
        self.target = self.model.target
        if isinstance(acceptance, str):
            if acceptance not in RULES:
                raise ValueError(f"acceptance: expected {', '.join(RULES)} or a rule object, got {acceptance!r}")
            acceptance = RULES[acceptance]()
        if not isinstance(acceptance, AcceptanceRule):
            raise ValueError(f"acceptance: {type(acceptance).__name__} is not an acceptance rule")  # noqa: TRY004
        if isinstance(acceptance, (Lantern, GSD)):  # its own copy: a rule object may serve samplers of other codebooks
            acceptance = copy.copy(acceptance).bind(self.model.codebook())
        self.rule: AcceptanceRule = acceptance
        if tree is not None and not isinstance(tree, TreeSpec):
            raise ValueError(f"tree: expected a TreeSpec, got {type(tree).__name__}")
        if tree is not None and not isinstance(proposer, ImageDrafter):
            raise ValueError(f"tree: only an ImageDrafter proposer takes one ({proposer!r} drafts a window: "
                             "`window`)")
        if isinstance(proposer, ImageDrafter):
            proposer.check_fits(self.model.lm)
            self.proposer = proposer.bind(self.target)
            self.tree = tree or DRAFTER_TREE
        elif proposer == "jacobi":
            self.proposer = JacobiProposer(self.target, window, init)
            self.tree = TreeSpec.chain(window - 1)
        elif proposer == "ar":
            self.proposer, self.tree = None, None
        else:
            raise ValueError(f"proposer: expected 'ar', 'jacobi' or an ImageDrafter, got {proposer!r}")
        if isinstance(cfg_interval, bool) or not isinstance(cfg_interval, int) or cfg_interval < -1:
            raise ValueError(f"cfg_interval: expected -1 (always) or a token index >= 0, got {cfg_interval!r}")
        self.cfg_interval = cfg_interval
        if not isinstance(compile, bool):
            raise ValueError(f"compile: expected True or False, got {compile!r}")
        if compile and not getattr(self.model, "compiles", False):
            raise ValueError(f"compile: {type(self.model).__name__} has no compiled fast path (LlamaGen, Janus and "
                             "Emu3 have: an image model says so with `compiles = True`); it runs eager")
        self.compile = compile
        self.profile = bool(profile)  # per-round time split in the stats (device syncs: for untimed runs)
        self.whole_round: bool | None = None  # compiled: whether the last sample's rounds ran as one graph each

    @classmethod
    def for_model(cls, model, processor=None, proposer: str | ImageDrafter = "jacobi",
                  acceptance: str | AcceptanceRule = "exact", **options) -> ImageSampler:
        """A sampler for a stock image generator (e.g. `JanusForConditionalGeneration` with its processor), its
        adapter picked by class name (`specmm.image_ar.models.register_image_model`); ValueError naming the class
        and what is supported otherwise."""
        return cls(image_model_for(model, processor), proposer=proposer, acceptance=acceptance, **options)

    @torch.no_grad()
    def sample(self, conditions, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, generator: Generators = None, caption_mask: Tensor | None = None,
               decode: bool = True, **options) -> ImageSample:
        """Sample one image per condition (class ids [B] or captions [B, T, D] for LlamaGen, text prompts for
        stock generators); per-row generators allowed; `options`: the model's own (e.g. a negative prompt)."""
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        max_nodes = 1 if self.tree is None else self.tree.num_nodes
        prompt, conditioning = self.model.conditioning(conditions, cfg_scale, max_nodes, cfg_interval=self.cfg_interval,
                                                       caption_mask=caption_mask, **options)
        batch, n = prompt.shape[0], self.model.tokens_per_image
        if generator is not None and not isinstance(generator, torch.Generator):
            if not isinstance(generator, (list, tuple)) or not all(isinstance(g, torch.Generator) for g in generator):
                raise ValueError(f"generator: expected a torch.Generator or a list of them, got {generator!r}")
            if len(generator) != batch:
                raise ValueError(f"generator: expected one generator or {batch} (one per row), got {len(generator)}")
        if self.proposer is None or n == 1:
            tokens, stats = self._sample_ar(prompt, conditioning, n, sampling, generator)
        else:
            if isinstance(self.proposer, ImageDrafter):  # one drafter may serve several samplers: it reads this one's
                self.proposer.bind(self.target)  # target (guidance, cache reserve) while this one generates
            gen = SpeculativeGenerator(self.target, self.proposer, tree=self.tree, acceptance=self.rule,
                                       compile=self.compile, profile=self.profile)
            out = gen.generate(prompt, max_new_tokens=n, sampling=sampling, generator=generator, **conditioning)
            tokens, stats = self.model.image_tokens(out.sequences), out.stats
            self.whole_round = gen.whole_round
        stats.image = ImageExtras(tokens_per_row=n)
        images = self.model.decode(tokens) if decode else []
        return ImageSample(images=images, tokens=tokens, stats=stats)

    def _sample_ar(self, prompt: Tensor, conditioning: dict, n: int, sampling: SamplingConfig,
                   generator: Generators) -> tuple[Tensor, GenerationStats]:
        """Plain decoding, one target forward per token: the baseline, with the same stats."""
        device, batch = self.target.device, prompt.shape[0]
        self.target.static_plan = image_plan(device) if self.compile else None
        compiling_before = CompileClock.seconds
        synchronize(device)
        started = time.perf_counter()
        self.target.start(batch)
        first_logits = self.target.prefill(prompt, prompt, **conditioning).next_logits
        tokens = generate_ar(self.target, first_logits, n, sampling, generator)
        synchronize(device)
        stats = GenerationStats(target_forwards=n, new_tokens=batch * n, wall_time_s=time.perf_counter() - started,
                                new_tokens_per_row=[n] * batch, target_forwards_per_row=[n] * batch,
                                accepted_histogram=[batch * n], compile_time_s=CompileClock.seconds - compiling_before)
        return tokens, stats
