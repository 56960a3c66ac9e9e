"""LlamaGen reproduces upstream golden data (c2i, t2i GPT and the VQ tokenizer) from upstream .pt files."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specmm.core.sampling import GREEDY
from specmm.core.tree import DraftTree
from specmm.image_ar import GuidedTarget, LlamaGen
from specmm.image_ar.autoregressive import generate_ar
from tests.image_ar.conftest import condition

FIXTURES = Path("/work/shared/fixtures/llamagen")
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="LlamaGen fixtures not available")


def _load(kind: str) -> tuple[LlamaGen, dict]:
    lg = LlamaGen.from_checkpoint(FIXTURES / f"gpt_{kind}.pt", FIXTURES / "vq.pt", FIXTURES / f"gpt_{kind}_config.json",
                                  FIXTURES / "vq_config.json", image_size=8)
    return lg, load_file(FIXTURES / f"gpt_{kind}_expected.safetensors")


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_teacher_forced_logits_match_upstream(kind):
    lg, expected = _load(kind)
    with torch.no_grad():
        logits = lg.gpt(expected["cond"], expected["tokens"])
    torch.testing.assert_close(logits, expected["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_cached_target_logits_match_upstream(kind):
    lg, expected = _load(kind)
    target = GuidedTarget(lg.gpt)
    first = condition(target, expected["cond"], 1.0, max_nodes=16)
    tokens = expected["tokens"]
    batch, n = tokens.shape
    chain = DraftTree(tokens=tokens, parents=torch.arange(n).expand(batch, n) - 1,
                      depth=torch.arange(n).expand(batch, n), valid=torch.ones(batch, n, dtype=torch.bool),
                      max_depth=n - 1, max_children=1)
    logits = torch.cat([first[:, None], target.verify(chain).logits[:, :-1]], 1)
    torch.testing.assert_close(logits, expected["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@pytest.mark.parametrize("scale,key", [(1.0, "greedy_nocfg"), (4.0, "greedy_cfg4")])
def test_greedy_tokens_match_upstream_generate(kind, scale, key):
    lg, expected = _load(kind)
    target = GuidedTarget(lg.gpt)
    first = condition(target, expected["cond"], scale, max_nodes=1)
    assert torch.equal(generate_ar(target, first, 16, GREEDY), expected[key])


def test_vq_encode_decode_reconstruct_match_upstream():
    lg, _ = _load("c2i")
    expected = load_file(FIXTURES / "vq_expected.safetensors")
    with torch.no_grad():
        assert torch.equal(lg.vq.encode(expected["image"]), expected["encoded_codes"])
        torch.testing.assert_close(lg.vq.decode_code(expected["codes"]), expected["decoded"], atol=1e-4, rtol=0)
        torch.testing.assert_close(lg.vq(expected["image"])[0], expected["reconstruction"], atol=1e-4, rtol=0)
