"""Streaming works with HF's TextStreamer; finished rows leave the batch."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, TextStreamer

import specmm
from specmm.drafters import ModelDrafter
from tests.conftest import VOCAB, left_padded_batch, perturbed_copy, tiny_model


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w0")


def test_hf_text_streamer_prints_exactly_the_generated_text(capsys):
    target = tiny_model("llama")
    tokenizer = word_tokenizer()
    ids, _ = left_padded_batch([5], seed=3)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=specmm.TreeSpec.chain(3))
    out = gen.generate(ids, max_new_tokens=20, streamer=TextStreamer(tokenizer, skip_prompt=True))
    printed = capsys.readouterr().out
    assert printed.strip() == tokenizer.decode(out.sequences[0, ids.shape[1]:]).strip()


class Collector:
    def __init__(self):
        self.prompt, self.chunks, self.ended = None, [], False

    def put(self, value):
        if self.prompt is None:
            self.prompt = value
        else:
            self.chunks.append(value)

    def end(self):
        self.ended = True


def test_batch_streaming_gives_each_row_its_tokens_in_order():
    target = tiny_model("qwen2")
    ids, mask = left_padded_batch([3, 7, 5], seed=2)
    collector = Collector()
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=specmm.TreeSpec.chain(3))
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=15, eos_token_id=None, streamer=collector)
    assert (collector.ended
            and [p.tolist() for p in collector.prompt] == [r[m.bool()].tolist() for r, m in zip(ids, mask)])
    for row in range(3):
        streamed = torch.cat([chunk[row] for chunk in collector.chunks]).tolist()
        assert streamed == out.sequences[row, ids.shape[1]:].tolist()


def test_finished_rows_leave_the_batch():
    target = tiny_model("llama")
    ids, mask = left_padded_batch([4, 6, 5, 8], seed=1)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
    eos = int(free[2, ids.shape[1] + 1])  # row 2 ends after two tokens
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=eos,
                                pad_token_id=0)
    widths = []
    target.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[0]),
                                     with_kwargs=True)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=specmm.TreeSpec.chain(2))
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, reference)
    assert widths[0] == 4 and min(widths) < 4, f"batch widths seen by the target: {widths}"
    assert sorted(widths, reverse=True) == widths  # never grows back


def test_generate_leaves_no_hooks_on_the_users_model():
    from specmm.drafters import EagleDrafter

    target = tiny_model("llama")
    norm = target.model.norm
    before = (len(norm._forward_hooks), len(target._forward_hooks))
    ids, _ = left_padded_batch([5], seed=0)
    specmm.SpeculativeGenerator(target, EagleDrafter.for_target(target)).generate(ids, max_new_tokens=4)
    assert (len(norm._forward_hooks), len(target._forward_hooks)) == before
