"""Bits per K/V element of a whole mixed cache at a context length, over layers that keep
different spans of tokens.

A sliding-window layer (Gemma 2/3/4, Mistral, Qwen2 with use_sliding_window, gpt-oss, ...)
keeps only its last W tokens, so past W it holds fewer tokens than a full-attention layer but
as many BF16 ones (sink + recent): its bits per element are higher, and the whole cache's
number is the total bits over the total elements held across layers.
"""

from __future__ import annotations

from collections.abc import Sequence

# layer kinds (transformers' config.layer_types) whose cache keeps a bounded span of tokens,
# with the config field that bounds it. A chunked layer (Llama 4) attends within its chunk
# only; caches give it a chunk's worth of slots, the most it ever holds
_BOUNDED = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def cache_bits(bits_int2: float, bf16_tokens: int, context_len: int,
               windows: Sequence[int | None], widths: Sequence[int]) -> float:
    """Bits per element the cache holds at context_len, each layer's tokens counted once.

    windows[i]: the tokens attention layer i keeps (None: all of them, full attention);
    widths[i]: its elements per token and side (kv heads x head_dim: Gemma 4's full layers
    are wider than its sliding ones). bf16_tokens: sink + recent, kept in BF16 in every layer,
    up to what the layer holds; the rest of its tokens are in the INT2 tier at bits_int2. A
    sliding layer's sink slots count though past W its attention no longer reads them: the
    most its BF16 tier can hold, so the figure errs high, never low. K and V hold the same
    elements per layer, so the factor of 2 cancels."""
    held = [context_len if w is None else min(w, context_len) for w in windows]
    elements = sum(n * e for n, e in zip(held, widths, strict=True))
    bf16 = sum(min(bf16_tokens, n) * e for n, e in zip(held, widths, strict=True))
    # integer sums until the last divisions, written as the single-span formula
    # bq (1 - w/L) + 16 w/L: where every layer holds L tokens, bf16 / elements is w / L as a
    # rational, and an int / int division rounds once, so such a model's number is that
    # formula's to the bit
    return bits_int2 * (1 - bf16 / elements) + 16 * bf16 / elements


def layer_windows(config) -> list[int | None]:
    """Per decoder layer (by global id), the tokens its attention keeps: the sliding window
    (or attention chunk), None for full attention. All None where the config names no window.

    config: a live transformers config (a multimodal one: get_text_config(), its text tower),
    or a config.json dict (its text_config where it has one). Configs with `layer_types` (every
    transformers 5 config of a model that mixes layer kinds, Qwen2 and Qwen2-MoE included) say
    it per layer. Without them: where the config has use_sliding_window, Qwen2's rule, layers
    from max_window_layers on slide and only with it set; else Mistral's, every layer slides by
    `sliding_window`. The Qwen2 rule is Qwen2's only: Qwen2-MoE slides alternate layers below
    max_window_layers, Qwen3-MoE every layer. Their live configs read right (Qwen2-MoE's carry
    layer_types; Qwen3-MoE's have no max_window_layers, so every layer slides), but a
    config.json dict of theirs with use_sliding_window on would not: pass the live config."""
    if isinstance(config, dict):
        cfg = config.get("text_config") or config
        get, has = cfg.get, cfg.__contains__
    else:   # attributes, not to_dict(): they follow attribute_map and the config's own defaults
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        get = lambda name: getattr(cfg, name, None)   # noqa: E731
        has = lambda name: hasattr(cfg, name)         # noqa: E731
    kinds = get("layer_types")
    if kinds:   # linear-attention layers get None too: callers count attention layers only
        return [_window(get(_BOUNDED[k])) if k in _BOUNDED else None for k in kinds]
    n = int(get("num_hidden_layers"))
    window = _window(get("sliding_window"))
    if has("use_sliding_window"):
        # Qwen2's config.json carries a sliding_window (often 131072) that its model ignores
        # unless use_sliding_window is set: reading it as Mistral's would slide every layer
        first = int(get("max_window_layers") or 0)
        return [window if get("use_sliding_window") and i >= first else None for i in range(n)]
    return [window] * n


def _window(value) -> int | None:
    # null or 0: no window (configs write both)
    return int(value) if value else None
