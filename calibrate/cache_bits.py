"""Bits per K/V element of a whole mixed cache at a context length, over layers that keep
different spans of tokens.

A sliding-window layer (Gemma 2/3/4, Mistral, Qwen2 with use_sliding_window, gpt-oss, ...)
reads only its last W tokens, so past W it holds fewer tokens than a full-attention layer, as
many recent BF16 ones and, once its window has slid past them, no sink: its bits per element
are higher, and the whole cache's number is the total bits over the total elements held across
layers. A KV-shared layer (Gemma 3n, Gemma 4) reads an earlier layer's cache and holds none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oscar_zoo.zoo.errors import InvalidInput, UnsupportedModelError
from oscar_zoo.zoo.geometry import layer_kinds, text_tower

# layer kinds (transformers' config.layer_types) whose cache keeps a bounded span of tokens,
# with the config field that bounds it. A chunked layer (Llama 4) attends within its chunk
# only; caches give it a chunk's worth of slots, the most it ever holds
_BOUNDED = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def cache_bits(bits_int2: float, sink: int, recent: int, context_len: int,
               windows: Sequence[int | None], widths: Sequence[int]) -> float:
    """Bits per element the cache holds at context_len, each layer's tokens counted once.

    windows[i]: the tokens layer i keeps (None: all of them, full attention); widths[i]: its
    elements per token and side (kv heads x head_dim: Gemma 4's full layers are wider than its
    sliding ones). Only layers that store K/V: callers leave out linear-attention and KV-shared
    layers. Of the tokens a layer holds, the sink's and the recent ones are BF16 (_bf16_rows),
    the rest in the INT2 tier at bits_int2. K and V hold the same elements per layer, so the
    factor of 2 cancels."""
    held = [context_len if w is None else min(w, context_len) for w in windows]
    elements = sum(n * e for n, e in zip(held, widths, strict=True))
    bf16 = sum(_bf16_rows(n, sink, recent, context_len) * e for n, e in zip(held, widths, strict=True))
    # integer sums until the last divisions, written as the single-span formula
    # bq (1 - w/L) + 16 w/L: where every layer holds L tokens, bf16 / elements is w / L as a
    # rational, and an int / int division rounds once, so such a model's number is that
    # formula's to the bit
    return bits_int2 * (1 - bf16 / elements) + 16 * bf16 / elements


def _bf16_rows(held: int, sink: int, recent: int, context_len: int) -> int:
    """Of the last `held` of context_len positions, those in the BF16 tier: the recent ones and
    the sink positions still among them.

    The sink is the sequence's positions [0, sink), not tokens pinned apart from them
    (oscar-spec 3.5: BF16 sink [0, P), INT2 history [P, t - R), BF16 recent [t - R, t)). A
    sliding layer's attention reads its last W positions only (the last token's included; its
    cache keeps W - 1 of them between steps, test-model.md 4) and its mask hides older keys,
    so the sink leaves it as the window slides on (oscar-spec names no sink kept apart for a
    sliding layer). Validation reads the same: its emulation takes key j from BF16 where
    j < sink or j is recent (int2_attention.tier_mask), under the model's sliding mask. A full
    layer holds them all: min(sink + recent, L)."""
    first = context_len - held
    return min(recent, held) + max(0, min(sink, context_len - recent) - first)


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
    config.json dict of theirs with use_sliding_window on would not: pass the live config.

    A window is read per layer, as transformers' cache sizes each layer's
    (cache_utils.get_layer_types_and_kwargs reads config.per_layer_config[i].sliding_window):
    transformers 5's per_layer_config may give layers their own (NeoMME alternates two sliding
    windows, and gives its full layers none)."""
    get, has, at = _fields(config)
    kinds = get("layer_types")
    if kinds:   # linear-attention layers get None too: callers count attention layers only
        return [_window(at(i, _BOUNDED[k])) if k in _BOUNDED else None for i, k in enumerate(kinds)]
    n = int(get("num_hidden_layers"))
    windows = [_window(at(i, "sliding_window")) for i in range(n)]
    if has("use_sliding_window"):
        # Qwen2's config.json carries a sliding_window (often 131072) that its model ignores
        # unless use_sliding_window is set: reading it as Mistral's would slide every layer
        first = int(get("max_window_layers") or 0)
        return [w if get("use_sliding_window") and i >= first else None for i, w in enumerate(windows)]
    return windows


def kv_shared_layers(config) -> set[int]:
    """Global ids of the layers that reuse an earlier layer's K/V and store none: the last
    num_kv_shared_layers (Gemma 3n, Gemma 4; transformers' kv_sharing_modes marks them
    "reuse", and its cache gives such a layer a DummyLayer that never stores anything,
    cache_utils.get_layer_types_and_kwargs). Empty for every other model. config: as
    layer_windows'."""
    get, _, _ = _fields(config)
    shared = int(get("num_kv_shared_layers") or 0)
    if not shared:
        return set()
    n = int(get("num_hidden_layers"))
    return set(range(n - shared, n))


def kv_sources(config) -> dict[int, int]:
    """{KV-shared layer: the layer whose cache it reads}, empty for models without sharing.

    transformers' rule (Gemma3nTextConfig / Gemma4TextConfig.kv_sharing_modes): a shared layer
    reads the last layer of its own kind (sliding or full) before the first shared one, whose
    K/V that layer hands it (shared_kv_states[layer_type]). A serving engine stores those K/V
    once, so the reader sees them as that layer wrote them: with its rotation, key mean and
    clips. config: as layer_windows' (a config.json dict without layer_types gets the ones
    its config class fills in: zoo.geometry.layer_kinds)."""
    shared = kv_shared_layers(config)
    if not shared:
        return {}
    get, _, _ = _fields(config)
    first = min(shared)
    kinds = get("layer_types") or ["full_attention"] * int(get("num_hidden_layers"))
    last_of = {kind: i for i, kind in enumerate(kinds[:first])}     # the last of each kind wins
    missing = sorted({kinds[i] for i in shared} - set(last_of))
    if missing:
        raise UnsupportedModelError(
            f"KV-shared layers {sorted(shared)[:8]} read the cache of an earlier "
            f"{' or '.join(missing)} layer, and this model has none before them "
            "(num_kv_shared_layers covers them all: an assistant model, which reads its target "
            "model's cache): calibrate and validate the target model instead")
    return {i: last_of[kinds[i]] for i in sorted(shared)}


def _fields(config):
    """(get, has, at) over config's text tower: get and has its own fields, at(i, name) the
    value layer i is built with, where transformers 5's per_layer_config sets one for it.

    A config.json dict (to_dict()'s too) keeps the global value at the top and the layers that
    differ in per_layer_config, keyed by layer id (zero-padded strings there). A live config
    raises AmbiguousGlobalPerLayerAttributeError, a RuntimeError that getattr(..., None) and
    hasattr let through, on reading a field that per_layer_config varies: `at` reads it from
    the layer's config (config.per_layer_config[i]); `get`, where it has no one value, gives
    None."""
    if isinstance(config, dict):
        cfg = text_tower(config)
        overrides = {int(i): o for i, o in (cfg.get("per_layer_config") or {}).items()}

        def get(name):
            # the layer_types transformers builds: Gemma 4's config classes fill them in or
            # correct them (zoo.geometry.layer_kinds)
            return layer_kinds(cfg) if name == "layer_types" else cfg.get(name)

        return get, cfg.__contains__, lambda i, name: overrides.get(i, {}).get(name, cfg.get(name))
    # attributes, not to_dict(): they follow attribute_map and the config's own defaults
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    per_layer = getattr(cfg, "per_layer_attributes", None) or set()

    def get(name):
        return None if name in per_layer else getattr(cfg, name, None)

    def at(i, name):
        layer = cfg.per_layer_config[i] if getattr(cfg, "is_heterogeneous", False) else cfg
        return getattr(layer, name, None)

    return get, (lambda name: name in per_layer or hasattr(cfg, name)), at


def _window(value) -> int | None:
    # null or 0: no window (configs write both)
    return int(value) if value else None


# what an engine looks up by a KV-shared layer's own id, named as the refusal names it:
# (name, side, SideTensors field)
_SHARED_FIELDS = (("rotation K", "k", "rotation"), ("rotation V", "v", "rotation"),
                  ("key mean", "k", "mean"), ("clip K", "k", "clip"), ("clip V", "v", "clip"))


def kv_shared_drift(bundle, sources: dict[int, int]) -> dict[int, list[str]]:
    """{KV-shared layer: the fields (_SHARED_FIELDS' names) whose stored tensors differ from
    its source layer's}, empty for a bundle that gives every reader its source's tensors.
    sources: kv_sources of the model. Exact: calibration copies the source's arrays, so any
    difference is a bundle made another way, not rounding. A layer the bundle lacks is left to
    check_geometry_of."""
    drift = {}
    for shared, source in sources.items():
        if shared not in bundle.k or source not in bundle.k:
            continue
        fields = [name for name, side, attr in _SHARED_FIELDS
                  if not _same(getattr(getattr(bundle, side)[shared], attr),
                               getattr(getattr(bundle, side)[source], attr))]
        if fields:
            drift[shared] = fields
    return drift


def _same(a, b) -> bool:
    if a is None or b is None:       # a key mean on one layer only
        return a is b
    return np.array_equal(a, b)


def check_kv_shared_tensors(bundle, sources: dict[int, int]) -> None:
    """InvalidInput naming the KV-shared layers whose tensors are not their source layer's.

    An engine stores a shared cache once, quantized with the source's rotations, key mean and
    clips, but looks each layer's tensors up by its own id: a reader carrying others would
    un-rotate that cache with matrices it was not written with. Validation reads the source's
    (stored_once), so it would score such a bundle well while engines serve it wrong: it is
    refused before any forward, so no report is made or written. Bundles calibrated before
    calibration gave readers their source's tensors, hand-made or converted ones can be so."""
    drift = kv_shared_drift(bundle, sources)
    if not drift:
        return
    name = bundle.manifest.model.name
    raise InvalidInput(
        f"this bundle gives KV-shared layers other tensors than the source layer whose cache "
        f"they read: {drift_text(drift, sources)}. An engine stores that cache once, with the "
        "source's tensors, and looks each layer's up by its own id, so these layers would read "
        "it with the wrong ones; validation measures the source's and would pass a bundle "
        "engines serve wrong. Bundles calibrated by an earlier oscar-zoo, converted from "
        "OSCAR's files or made by hand can be so: recalibrate with this version, which gives "
        f"every shared layer its source's tensors (`oscar-zoo calibrate {name} --validate "
        "--out DIR`)")


def drift_text(drift: dict[int, list[str]], sources: dict[int, int]) -> str:
    """'rotation K, clip V on layers 20 (source 18), 21 (source 18)': readers grouped by what
    differs: a model's readers (a dozen or more) usually all differ alike."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for lid, fields in drift.items():
        groups.setdefault(tuple(fields), []).append(lid)
    parts = []
    for fields, lids in groups.items():
        named = [f"{lid} (source {sources[lid]})" for lid in lids[:8]]
        if len(lids) > 8:
            named.append(f"{len(lids) - 8} more")
        parts.append(f"{', '.join(fields)} on layer{'s' * (len(lids) > 1)} {', '.join(named)}")
    return "; ".join(parts)
