"""Bits per element of a whole mixed cache (calibrate/cache_bits.py), against caches laid out
position by position in the tests, and the layers' windows and KV sharing read from configs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate.cache_bits import (_bf16_rows, _fields, cache_bits, kv_shared_layers,
                                            layer_windows)
from oscar_zoo.calibrate.int2_attention import tier_mask
from oscar_zoo.calibrate.validate import _bits_at_context
from oscar_zoo.zoo.geometry import geometry_from_config


def _tiers(context_len: int, sink: int, recent: int, window: int | None) -> list[str]:
    """One layer's cache at context_len, position by position: the positions it holds (its
    last `window`, all for None) and the tier of each, BF16 for the sequence's first `sink`
    and last `recent` positions (oscar-spec 3.5), INT2 for the rest."""
    held = range(context_len - min(window or context_len, context_len), context_len)
    return ["bf16" if p < sink or p >= context_len - recent else "int2" for p in held]


def _bits_of_layout(layers, context_len, sink, recent, group, scale_bytes) -> float:
    """8 x bytes / elements of K and V over `layers`, (window, kv_heads, head_dim) each: a BF16
    row is 2 bytes an element; an INT2 row packs 4 codes a byte plus a scale and a zero per
    group (oscar-spec 3.3)."""
    nbytes = elements = 0
    for window, heads, d in layers:
        for tier in _tiers(context_len, sink, recent, window):
            row = 2 * d if tier == "bf16" else d // 4 + 2 * (d // group) * scale_bytes
            nbytes += 2 * heads * row                          # K and V
            elements += 2 * heads * d
    return 8 * nbytes / elements


# Gemma 4 in small: layer 0 slides (16 tokens, head_dim 32), 1 and 2 are full (head_dim 64),
# and 2 reuses layer 1's K/V: it stores nothing
SMALL = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "global_head_dim": 64, "hidden_size": 128, "sliding_window": 16,
         "layer_types": ["sliding_attention", "full_attention", "full_attention"],
         "num_kv_shared_layers": 1}
SINK, RECENT, GROUP = 4, 8, 32
FP16_SCALES = SimpleNamespace(scale_dtype="float16", group_size=GROUP, sink_tokens=SINK,
                              recent_tokens=RECENT)                     # INT2 tier: 3 bits


def test_a_cache_with_a_sliding_and_a_shared_layer_by_hand():
    """At 64 tokens. Layer 0 holds positions 48..63: 56..63 recent (BF16), 48..55 INT2, its
    sink (0..3) slid out of its window; K and V rows of 2 heads x 32: BF16 128 B, INT2 8 B of
    codes + fp16 scale and zero x 2 heads = 24 B. Layer 1 holds all 64: 4 sink + 8 recent in
    BF16 (2 x 64 x 2 = 256 B a row), 52 INT2 (2 x (16 + 4) = 48 B a row). Layer 2: nothing."""
    geometry = geometry_from_config(SMALL)
    assert [geometry.head_dim_of(i) for i in range(3)] == [32, 64, 64]
    nbytes = 2 * (8 * 128 + 8 * 24) + 2 * (12 * 256 + 52 * 48)
    elements = 2 * (16 * 2 * 32) + 2 * (64 * 2 * 64)
    assert 8 * nbytes / elements == _bits_of_layout([(16, 2, 32), (None, 2, 64)], 64, SINK, RECENT,
                                                    GROUP, 2)
    bits, windows = _bits_at_context(FP16_SCALES, 64, geometry, SMALL)
    assert bits == pytest.approx(8 * nbytes / elements, rel=1e-12)
    assert windows == {"0": 16}


@pytest.mark.parametrize("context_len", [5, 12, 16, 17, 18, 20, 21, 64, 4096])
def test_the_bits_are_the_bytes_of_the_layout_at_any_length(context_len):
    """Below sink + recent, up to the window, while the window still reaches into the sink
    (17..19), once it has left it, and far past it."""
    bits, _ = _bits_at_context(FP16_SCALES, context_len, geometry_from_config(SMALL), SMALL)
    assert bits == pytest.approx(_bits_of_layout([(16, 2, 32), (None, 2, 64)], context_len, SINK,
                                                 RECENT, GROUP, 2), rel=1e-12)


@pytest.mark.parametrize("context_len", range(1, 40))
@pytest.mark.parametrize("window", [None, 4, 12, 16])
def test_a_layers_bf16_rows_are_what_validation_reads_from_bf16(context_len, window):
    """The last query of a layer reads key j from BF16 where validation's emulation says so
    (int2_attention.tier_mask), among the keys the model's mask lets it see (its window): the
    cache holds in BF16 what quality was measured with."""
    j = torch.arange(context_len)
    last = torch.tensor([context_len - 1])
    seen = (j > context_len - 1 - window) if window else torch.ones(context_len, dtype=torch.bool)
    held = min(window or context_len, context_len)
    read = int((tier_mask(last, context_len, SINK, RECENT)[0] & seen).sum())
    assert _bf16_rows(held, SINK, RECENT, context_len) == read == _tiers(
        context_len, SINK, RECENT, window).count("bf16")


def _bits_by_hand(bq: float, sink: int, recent: int, context_len: int, windows, widths) -> float:
    """Every row each layer holds, counted one by one in float64 (_tiers), K and V alike,
    `width` elements a row."""
    bits = elements = np.float64(0)
    for window, width in zip(windows, widths):
        per_row = np.array([16.0 if t == "bf16" else bq for t in _tiers(context_len, sink, recent, window)])
        bits += 2 * width * per_row.sum()
        elements += 2 * width * len(per_row)
    return float(bits / elements)


def _single_span(bq: float, bf16_tokens: int, context_len: int) -> float:
    """The report's formula before sliding windows: every layer holds the whole context."""
    w = min(bf16_tokens, context_len)
    return bq * (1 - w / context_len) + 16 * w / context_len


@pytest.mark.parametrize("bq, context_len, windows, widths, above", [
    (2.5, 96, [None, 128, None, 128], [192] * 4, False),      # L below W: as if all full
    (2.5, 512, [None, 128, None, 128], [192] * 4, True),      # L above W
    (3.0, 96, [16, None, 16], [192] * 3, True),               # W below sink + recent (24)
    (2.25, 1000, [64, 64, 64, 64, 64, None], [512] * 5 + [1024], True),   # Gemma 4: wider full layers
])
def test_cache_bits_count_every_layers_rows(bq, context_len, windows, widths, above):
    """bits_at_context assumed every layer holds the whole context: a sliding-window layer past
    its window holds W tokens, a higher share of them 16-bit rows."""
    got = cache_bits(bq, 8, 16, context_len, windows, widths)
    assert got == pytest.approx(_bits_by_hand(bq, 8, 16, context_len, windows, widths), rel=1e-12)
    if above:
        assert got > _single_span(bq, 24, context_len) + 0.1
    else:
        assert got == pytest.approx(_single_span(bq, 24, context_len), rel=1e-12)


def test_a_sliding_layer_past_its_window_keeps_no_sink():
    """Its sink slots were counted though its window had left the sink behind: the figure
    erred high. Full: 24 x 16 + 488 x 2.5 bits over 512 rows; windowed: its 16 recent rows x
    16 + 112 x 2.5 over 128 (the 8 sink rows counted gave 24 x 16 + 104 x 2.5)."""
    assert cache_bits(2.5, 8, 16, 512, [None, 128], [1, 1]) == pytest.approx((1604 + 536) / 640)


@pytest.mark.parametrize("bq, sink, recent, context_len", [
    (4.0, 8, 16, 96), (2.5, 64, 256, 2048), (2.0 + 2 * 16 / 96, 64, 256, 4097), (2.25, 3, 4, 3),
    (3.0, 1000, 4000, 2048)])                                  # sink + recent beyond the context
@pytest.mark.parametrize("windows", [[None] * 30, [None, 1 << 20, None]])   # windows past L: full
def test_a_cache_without_windows_keeps_the_single_span_number_to_the_bit(bq, sink, recent,
                                                                       context_len, windows):
    """Models without sliding windows (every catalog model but Gemma 4) keep the number their
    published reports carry, to the last bit."""
    widths = [3 * 64] * len(windows)
    assert cache_bits(bq, sink, recent, context_len, windows, widths) == _single_span(
        bq, sink + recent, context_len)


def _config(name, **kw):
    import transformers

    return getattr(transformers, name)(**kw)


@pytest.mark.parametrize("make, windows", [
    (lambda: _config("Gemma3TextConfig", num_hidden_layers=8, sliding_window=512),
     [512] * 5 + [None] + [512] * 2),                           # 5 sliding : 1 full
    (lambda: _config("Gemma3Config", text_config={"num_hidden_layers": 8, "sliding_window": 512}),
     [512] * 5 + [None] + [512] * 2),                           # multimodal: its text tower
    (lambda: _config("Gemma2Config", num_hidden_layers=4, sliding_window=4096), [4096, None] * 2),
    (lambda: _config("GptOssConfig", num_hidden_layers=4, sliding_window=128), [128, None] * 2),
    (lambda: _config("Qwen2Config", num_hidden_layers=4, use_sliding_window=True, sliding_window=64,
                     max_window_layers=2), [None, None, 64, 64]),
    (lambda: _config("Qwen2Config", num_hidden_layers=4, sliding_window=64, max_window_layers=2),
     [None] * 4),                                               # use_sliding_window off
    (lambda: _config("MistralConfig", num_hidden_layers=3, sliding_window=4096), [4096] * 3),
    (lambda: _config("MistralConfig", num_hidden_layers=3, sliding_window=None), [None] * 3),
    # not Qwen2's rule, read right from the live configs: Qwen2-MoE's layer_types, and
    # Qwen3-MoE's want of max_window_layers (its model slides every layer)
    (lambda: _config("Qwen2MoeConfig", num_hidden_layers=4, use_sliding_window=True,
                     sliding_window=64, max_window_layers=3), [64, None, 64, None]),
    (lambda: _config("Qwen3MoeConfig", num_hidden_layers=3, use_sliding_window=True,
                     sliding_window=64), [64] * 3),
    (lambda: _config("LlamaConfig", num_hidden_layers=3), [None] * 3),
    (lambda: _config("Llama4TextConfig", num_hidden_layers=4, attention_chunk_size=8192),
     [8192] * 3 + [None]),                                      # chunked: a chunk at most
    # config.json dicts from before layer_types: Qwen2.5 writes a window it does not use
    (lambda: {"num_hidden_layers": 4, "sliding_window": 131072, "use_sliding_window": False,
              "max_window_layers": 2}, [None] * 4),
    (lambda: {"num_hidden_layers": 4, "sliding_window": 4096, "use_sliding_window": True,
              "max_window_layers": 2}, [None, None, 4096, 4096]),
    (lambda: {"num_hidden_layers": 2, "sliding_window": 4096}, [4096, 4096]),    # Mistral 7B v0.1
    (lambda: {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
              "sliding_window": None}, [None, None]),           # hybrid: no window anywhere
], ids=["gemma3-text", "gemma3-multimodal", "gemma2", "gpt-oss", "qwen2-sliding", "qwen2-off",
        "mistral", "mistral-no-window", "qwen2-moe", "qwen3-moe", "llama", "llama4-chunked", "qwen2.5-json-off",
        "qwen2-json-on", "mistral-json", "hybrid-json"])
def test_layer_windows_are_read_from_the_config(make, windows):
    assert layer_windows(make()) == windows


@pytest.mark.parametrize("make", [
    lambda: _config("Gemma3nTextConfig", num_hidden_layers=10, num_kv_shared_layers=4),
    lambda: _config("Gemma4TextConfig", num_hidden_layers=12, num_kv_shared_layers=4),
    lambda: _config("Gemma4Config", text_config={"num_hidden_layers": 12, "num_kv_shared_layers": 4}),
    lambda: _config("Gemma4TextConfig", num_hidden_layers=6),
    lambda: _config("LlamaConfig", num_hidden_layers=3),
], ids=["gemma3n", "gemma4-text", "gemma4-multimodal", "gemma4-unshared", "llama"])
def test_kv_shared_layers_are_those_transformers_gives_no_cache(make):
    """transformers' own per-layer answer, kv_sharing_modes ("reuse": a DummyLayer in the
    cache), where the config has it; the rule is read from num_kv_shared_layers, which
    config.json carries too."""
    config = make()
    modes = getattr(config.get_text_config(), "kv_sharing_modes", None) or []
    assert kv_shared_layers(config) == {i for i, mode in enumerate(modes) if mode == "reuse"}
    assert kv_shared_layers(config.to_dict()) == kv_shared_layers(config)


def test_a_config_json_names_its_shared_layers():
    assert kv_shared_layers(SMALL) == {2}
    assert kv_shared_layers({"text_config": SMALL}) == {2}
    assert kv_shared_layers({"num_hidden_layers": 4, "num_kv_shared_layers": 0}) == set()
    assert kv_shared_layers({"num_hidden_layers": 4}) == set()


def _cache_windows(config) -> list[int | None]:
    """The tokens transformers' own cache keeps per layer: a DynamicCache built from the config
    gives each sliding (or chunked) layer its window (cache_utils.get_layer_types_and_kwargs,
    reading config.per_layer_config[i]), a full layer none."""
    from transformers import DynamicCache

    return [getattr(layer, "sliding_window", None) for layer in DynamicCache(config=config).layers]


def _every_form(config, tmp_path) -> dict:
    """The live config, its to_dict() and the config.json save_pretrained writes."""
    import json

    config.save_pretrained(tmp_path)
    return {"live": config, "to_dict": config.to_dict(),
            "saved config.json": json.loads((tmp_path / "config.json").read_text())}


def test_per_layer_windows_are_those_the_model_attends_and_caches_with(tmp_path):
    """NeoMME alternates two sliding windows (256, 1024) through per_layer_config and gives its
    full layers none: its live config raises on reading sliding_window
    (AmbiguousGlobalPerLayerAttributeError), its to_dict() holds 256 at the top."""
    import transformers

    if not hasattr(transformers, "NeoMMEConfig"):
        pytest.skip("this transformers has no NeoMME")
    config = transformers.NeoMMEConfig(num_hidden_layers=8, hidden_size=32, intermediate_size=64,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       vocab_size=128, embedding_rank=16)
    model = transformers.AutoModel.from_config(config)
    # NeoMMEAttention adds 1 to the layer's window for flash attention's exclusive bound
    attended = [a.sliding_window - 1 if a.sliding_window else None
                for a in (layer.self_attn for layer in model.layers)]
    assert attended == _cache_windows(config) == [256, 1024, 256, 1024, 256, None, 1024, None]
    for form, cfg in _every_form(config, tmp_path).items():
        assert layer_windows(cfg) == attended, form
        assert kv_shared_layers(cfg) == set(), form
    get, has, _ = _fields(config)       # the global read that raises: no one value, no error
    assert get("sliding_window") is None and has("sliding_window")


@pytest.mark.parametrize("make", [
    lambda: _config("Gemma3TextConfig", num_hidden_layers=4, sliding_window=64,
                    per_layer_config={1: {"sliding_window": 16}, 3: {"sliding_window": 128}}),
    lambda: _config("Gemma3Config", text_config={"num_hidden_layers": 4, "sliding_window": 64,
                                                 "per_layer_config": {2: {"sliding_window": 8}}}),
    lambda: _config("Llama4TextConfig", num_hidden_layers=4, attention_chunk_size=64,
                    per_layer_config={0: {"attention_chunk_size": 16}}),
    lambda: _config("MistralConfig", num_hidden_layers=3, sliding_window=4096,
                    per_layer_config={1: {"sliding_window": 512}}),      # no layer_types
], ids=["gemma3-text", "gemma3-multimodal", "llama4-chunked", "mistral"])
def test_windows_set_per_layer_are_those_the_cache_keeps(make, tmp_path):
    """per_layer_config is transformers 5's for any config: whatever layer it gives a window
    (or chunk) of its own, the cache keeps that many of its tokens."""
    config = make()
    expected = _cache_windows(config.get_text_config())
    assert len(set(expected)) > 1                            # the layers' windows differ
    for form, cfg in _every_form(config, tmp_path).items():
        assert layer_windows(cfg) == expected, form


_GEMMA4 = {"model_type": "gemma4_text", "num_hidden_layers": 8, "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
           "vocab_size": 128, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 128,
           "sliding_window": 64}
_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 2, "head_dim": 8}


@pytest.mark.parametrize("config_json, windows", [
    (_GEMMA4, [64] * 5 + [None, 64, None]),                     # no layer_types: 5:1, last full
    ({**_GEMMA4, "layer_types": ["sliding_attention"] * 8}, [64] * 7 + [None]),    # last made full
    ({"model_type": "gemma4", "vision_config": _VISION, "audio_config": None,
      "text_config": {k: v for k, v in _GEMMA4.items() if k != "model_type"}},
     [64] * 5 + [None, 64, None]),                              # a tower that names no model_type
], ids=["no-layer-types", "last-sliding", "multimodal-untyped-text-config"])
def test_a_gemma4_config_json_slides_the_layers_transformers_slides(config_json, windows):
    """Gemma 4's config classes fill in layer_types and make the last layer full (zoo.geometry
    .layer_kinds): the windows of its config.json dict are those of the model built from it."""
    import copy

    import transformers

    # a copy: transformers writes into the layer_types list it is given
    fields = {k: v for k, v in copy.deepcopy(config_json).items() if k != "model_type"}
    config = (transformers.Gemma4Config(**fields) if "text_config" in fields
              else transformers.Gemma4TextConfig(**fields)).get_text_config()
    model = transformers.AutoModel.from_config(config)
    attended = [layer.self_attn.sliding_window for layer in model.layers]
    assert attended == _cache_windows(config) == windows
    assert layer_windows(config_json) == windows == layer_windows(config)
