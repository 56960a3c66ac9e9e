"""Text-conditional (t2i) sampling: padded caption positions hidden by `caption_mask` cannot change the image."""

import torch

from specmm.image_ar import ImageDrafter, ImageSampler
from tests.image_ar.conftest import tiny_llamagen

TOKENS, WIDTH = 6, 12  # caption tokens per prompt, caption embedding width


def _captions(padding_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two captions [2, T, D] with the first 2 / 4 positions padding (left padded, as LlamaGen feeds T5)."""
    captions = torch.randn(2, TOKENS, WIDTH, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, TOKENS, dtype=torch.long)
    mask[0, :2], mask[1, :4] = 0, 0
    noise = torch.randn(2, TOKENS, WIDTH, generator=torch.Generator().manual_seed(padding_seed)) * 3
    return torch.where(mask.bool()[..., None], captions, noise), mask


def test_masked_caption_padding_does_not_change_greedy_tokens_ar_or_speculative():
    lg = tiny_llamagen(model_type="t2i", caption_dim=WIDTH, cls_token_num=TOKENS)
    (first, mask), (second, _) = _captions(1), _captions(2)

    def tokens(captions, caption_mask, proposer="ar"):
        sampler = ImageSampler(lg, proposer=proposer)
        return sampler.sample(captions, cfg_scale=2.0, temperature=0.0, caption_mask=caption_mask, decode=False).tokens

    reference = tokens(first, mask)
    assert torch.equal(tokens(second, mask), reference)  # other padding content, same image
    assert not torch.equal(tokens(second, None), reference)  # unmasked, the padding content does matter
    drafter = ImageDrafter.for_target(lg.gpt)
    assert torch.equal(tokens(second, mask, drafter), reference)  # speculative = AR under the mask too
    assert torch.equal(tokens(first, mask, "jacobi"), reference)
