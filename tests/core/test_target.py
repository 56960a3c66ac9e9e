"""The HF adapter's keyword for the KV cache: transformers 5.24 renamed `past_key_values` to `cache`."""

from __future__ import annotations

import inspect

from torch import nn
from transformers import LlamaModel

from specmm.core.target import cache_keyword


class TakesPastKeyValues(nn.Module):
    def forward(self, hidden, past_key_values=None):
        return hidden


class TakesCache(nn.Module):
    def forward(self, hidden, cache=None):
        return hidden


class PassesKwargsOn(nn.Module):  # like EagleHead: everything goes to a stock decoder
    def forward(self, hidden, **kwargs):
        return hidden


def test_cache_keyword_is_the_one_each_forward_declares_and_the_stock_decoders_for_kwargs():
    assert cache_keyword(TakesPastKeyValues()) == "past_key_values"
    assert cache_keyword(TakesCache()) == cache_keyword(TakesCache) == "cache"
    stock = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
    assert cache_keyword(PassesKwargsOn()) == stock
