"""See every layer's post-RoPE Q, K and V as the KV cache stores them, through transformers'
attention interface (test-model.md section 4).

We register our own attention function that hands (module, q, k, v, mask) to the current
observer and then runs SDPA unless the observer returned its own output (validation replaces
attention with the INT2-cache version). The matching mask function must be registered too:
transformers passes mask=None to implementations it does not know, which would silently drop
sliding windows.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

ATTN_NAME = "oscar_zoo"

# observer(module, q, k, v, mask, kwargs) -> an output tensor [B, T, Hq, d] to use instead of
# SDPA's, or anything else (None) to only observe.
Observer = Callable[..., "object | None"]
_observers: list[Observer] = []
_registered = False


def _attention(module, query, key, value, attention_mask, **kwargs):
    # query: [B, Hq, T, d]; key/value: [B, Hkv, S, d], post-RoPE, not yet repeated for GQA
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _observers:
        out = _observers[-1](module, query, key, value, attention_mask, kwargs)
        if isinstance(out, torch.Tensor):
            return out, None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, _attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    _registered = True


def install(model) -> None:
    register()
    model.set_attn_implementation(ATTN_NAME)


@contextmanager
def observing(fn: Observer) -> Iterator[None]:
    _observers.append(fn)
    try:
        yield
    finally:
        _observers.remove(fn)


def bool_mask(attention_mask, q_len: int, k_len: int, device):
    """The model's mask as booleans [B or 1, 1, T, S] (True = may attend), causal if None."""
    import torch

    if attention_mask is None:
        return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2
