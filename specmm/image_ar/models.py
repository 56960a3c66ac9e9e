"""The image models `ImageSampler` drives: the `ImageModel` protocol an adapter implements, and a registry of
adapters for stock image generators keyed by class name (`ImageSampler.for_model` dispatches through it).

An adapter owns a guided core target (the doubled cond/uncond batch, guidance, tree verification), turns the
user's conditions (class ids, captions, text prompts) into the engine's prompt and model inputs, and knows its
image tokens: how many make an image, their codebook embeddings (LANTERN / GSD), and how they decode to pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from PIL import Image
import torch
from torch import Tensor, nn

from specmm.core.target import FEATURES
from specmm.core.tree import DraftTree


@runtime_checkable
class ImageModel(Protocol):
    """What `ImageSampler` needs from an autoregressive image model.

    `target` is a core `Target` over both guidance halves with `last_logits` (Jacobi reads them), `static_plan`,
    `guided`, `max_nodes`, `cfg_tensor` (the drafter reads them), `grid_size`, `tokens_per_image` and `owner` (the
    module the image parts hang on). `lm` is what an `ImageDrafter` reads: `config` (its head's `GPTConfig`),
    `tok_embeddings(ids)` (the embeddings the target feeds back for image tokens) and `logits(features)`.
    Adapters of stock models also give `hf_generate(prompts, cfg_scale, **generate_kwargs) -> tokens [B, N]`: the
    HF `generate` call they reproduce (`specmm bench image_ar --model` times it as the baseline).
    """

    target: Any
    lm: nn.Module
    tokens_per_image: int

    def conditioning(self, conditions: Any, cfg_scale: float, max_nodes: int, cfg_interval: int = -1,
                     caption_mask: Tensor | None = None, **options: Any) -> tuple[Tensor, dict]:
        """Check the conditions, guidance and model-specific `options` (extra keywords of `ImageSampler.sample`,
        e.g. a negative prompt; ValueError before any work) -> (prompt ids [B, 0], the target's model inputs)."""
        ...

    def codebook(self) -> Tensor:
        """[V, d] codebook embedding of every image token (LANTERN neighbours, GSD groups)."""
        ...

    def image_tokens(self, sequences: Tensor) -> Tensor:
        """The generated sequences [B, >= N] -> the image tokens [B, N] in raster order."""
        ...

    def decode(self, tokens: Tensor) -> list[Image.Image]:
        """Image tokens [B, N] -> PIL images."""
        ...


Builder = Callable[..., ImageModel]
_BUILDERS: dict[str, Builder] = {}
_SIZED: set[str] = set()  # classes whose builder takes `latent_size=(height, width)`


def register_image_model(class_name: str, build: Builder, sized: bool = False) -> None:
    """Serve stock models of class `class_name` with `build(model, processor)` (processor may be None when only
    the drafter's view `lm` is wanted); `sized`: the model generates images of any size, and `build` takes
    `latent_size=(height, width)` in latent tokens."""
    _BUILDERS[class_name] = build
    if sized:
        _SIZED.add(class_name)


def supported_models() -> list[str]:
    _load_builtin()
    return ["LlamaGen", *sorted(_BUILDERS)]


def image_model_for(model: Any, processor: Any = None, latent_size: tuple[int, int] | None = None) -> ImageModel:
    """The adapter for `model`: an `ImageModel` as is, a LlamaGen, or a registered stock class; `latent_size`
    (height, width) in latent tokens for a model that generates any size (Emu3; default: its processor's)."""
    from specmm.image_ar.llamagen.adapter import LlamaGenImageModel
    from specmm.image_ar.llamagen.model import LlamaGen

    name = type(model).__name__
    check_latent_size(name, latent_size)
    if isinstance(model, LlamaGen):
        return LlamaGenImageModel(model)
    if isinstance(model, ImageModel) and not isinstance(model, nn.Module):
        return model
    if name not in _BUILDERS:
        raise ValueError(f"model: {name} is not an image generator specmm can serve; supported: "
                         f"{', '.join(supported_models())}")
    if latent_size is not None:
        return _BUILDERS[name](model, processor, latent_size=latent_size)
    return _BUILDERS[name](model, processor)


def check_latent_size(class_name: str, latent_size: tuple[int, int] | None) -> None:
    """ValueError unless `latent_size` is None or the class generates images of any size."""
    _load_builtin()
    if latent_size is not None and class_name not in _SIZED:
        raise ValueError(f"latent_size: {class_name} generates images of one size; models that take a size: "
                         f"{', '.join(sorted(_SIZED))}")


def folder_class_name(folder) -> str:
    """The transformers class a saved folder's config.json names; ValueError when it names none."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    name = (getattr(config, "architectures", None) or [""])[0]
    if not name or getattr(transformers, name, None) is None:
        raise ValueError(f"model: {folder}/config.json names no transformers class ({name!r})")
    return name


def load_pretrained(folder, dtype=None, device=None,
                    latent_size: tuple[int, int] | None = None) -> tuple[nn.Module, Any]:
    """(model, processor) from a folder saved with `save_pretrained`: the class its config.json names (a stock
    transformers class), and `AutoProcessor`; a `latent_size` the class cannot take is refused before loading."""
    import transformers

    name = folder_class_name(folder)
    check_latent_size(name, latent_size)
    cls = getattr(transformers, name)
    model = cls.from_pretrained(folder, dtype=dtype).eval()
    if device is not None:
        model = model.to(device)
    return model, transformers.AutoProcessor.from_pretrained(folder)


def check_token_ids(ids: Any, mask: Any, name: str) -> None:
    """ValueError unless `ids` is an integer [B, L] tensor (L >= 1) and `mask` (if given) a tensor of its shape."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] == 0:
        shape = list(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name}: expected token ids [prompts, length] (a 2-D tensor), got {shape}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer token ids, got {ids.dtype}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.shape != ids.shape):
        shape = list(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name}: its attention mask must be a tensor of its shape {list(ids.shape)}, got {shape}")


def refuse_options(options: dict, model: str) -> None:
    """ValueError naming `sample` keywords the model takes no option for."""
    if options:
        raise ValueError(f"{', '.join(sorted(options))}: not a sampling option of {model}")


@torch.no_grad()
def teacher_forced_features(model: ImageModel, conditions: Any, tokens: Tensor, cfg_scale: float = 1.0,
                            caption_mask: Tensor | None = None) -> Tensor:
    """Teacher forcing for drafter training: image tokens [B, N] under `conditions` through the model's guided
    target, its conditioning prefill (the prompt's last position, which predicts token 0), then one verify of tokens
    0..N-2 as a chain -> features [R, N, d] (R = 2B when cfg_scale > 1: cond rows, then uncond), feature i the one
    that predicts token i. The same forwards a sampling run makes, hence the features the drafter reads there."""
    batch, n = tokens.shape
    _, conditioning = model.conditioning(conditions, cfg_scale, max(n, 1), caption_mask=caption_mask)
    target = model.target
    plan, target.static_plan = target.static_plan, None  # eager: a whole-image chain is no sampling shape
    prompt = torch.zeros(batch, 0, dtype=torch.long, device=target.device)
    try:
        target.start(batch, needs=frozenset({FEATURES}))
        features = [target.prefill(prompt, prompt, **conditioning).features]  # [B, 1, F]
        if n > 1:
            steps = torch.arange(n - 1, device=target.device).expand(batch, -1)
            chain = DraftTree(tokens=tokens[:, :-1].to(target.device), parents=steps - 1, depth=steps,
                              valid=torch.ones_like(steps, dtype=torch.bool), max_depth=n - 2, max_children=1)
            features.append(target.verify(chain).features)  # [B, N - 1, F]
        packed = torch.cat(features, 1)
        return torch.cat(packed.chunk(2, -1)) if target.guided else packed
    finally:
        target.close()
        target.static_plan = plan


def _load_builtin() -> None:
    """Import the adapters shipped with specmm (each registers itself); missing optional ones are skipped."""
    import importlib

    for module in ("specmm.image_ar.janus", "specmm.image_ar.emu3"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise


__all__ = ["ImageModel", "image_model_for", "load_pretrained", "refuse_options", "register_image_model",
           "supported_models", "teacher_forced_features"]
