"""headway.kv's transformers-version seam: which keyword a forward takes its cache by."""

from __future__ import annotations

import functools

import torch

from headway.kv import cache_kwarg


def test_cache_kwarg_names_the_keyword_the_forward_takes():
    """transformers renamed past_key_values to cache within 5.x; an unknown keyword would be swallowed
    by **kwargs and the forward would silently run without its cache."""
    class New(torch.nn.Module):
        def forward(self, x, cache=None, **kwargs):
            return x

    class Old(torch.nn.Module):
        def forward(self, x, past_key_values=None, **kwargs):
            return x

    def renamed(fn):  # like transformers' deprecate_kwarg: a wrapper that keeps __wrapped__
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k)

        return wrapper

    class Wrapped(torch.nn.Module):
        @renamed
        def forward(self, x, cache=None, **kwargs):
            return x

    marker = object()
    assert cache_kwarg(New(), marker) == {"cache": marker}
    assert cache_kwarg(Old(), marker) == {"past_key_values": marker}
    assert cache_kwarg(Wrapped(), marker) == {"cache": marker}
