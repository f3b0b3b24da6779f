"""Per-layer geometry of Gemma 4 configs, against the K/V projections transformers builds from
them: every form calibration and validation meet (the released config.json, the live config,
its to_dict(), the config.json save_pretrained writes) must give the layers' real widths."""

from __future__ import annotations

import copy

import pytest

from oscar_zoo.zoo.geometry import geometry_from_config, geometry_from_config_file

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

# A tiny Gemma 4 text tower: 5:1 sliding/full, so layer 5 is the one full-attention layer; no
# per-layer embeddings (Gemma 4's defaults would make them 262144 x 256 a layer)
_TEXT = {"num_hidden_layers": 6, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128}
_PLE_OFF = {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 128}
_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 2, "head_dim": 8}

# (kv heads, head_dim) transformers gives layer 5, for the keys a released config.json sizes it by
_FULL_LAYER = {
    # Gemma 4 12B's way: keys double as values on full layers, which have one KV head
    "k-eq-v": ({"global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True}, (1, 32)),
    # without attention_k_eq_v the model keeps the sliding layers' KV heads
    "kv-override-off": ({"global_head_dim": 32, "num_global_key_value_heads": 1,
                         "attention_k_eq_v": False}, (2, 32)),
    "more-kv-heads": ({"global_head_dim": 8, "num_global_key_value_heads": 4, "attention_k_eq_v": True}, (4, 8)),
    "default-width": ({}, (2, 512)),        # global_head_dim left out: Gemma 4's 512
    # attention_k_eq_v left out: it defaults off, so the KV-head override does not apply
    "kv-override-unset": ({"global_head_dim": 32, "num_global_key_value_heads": 1}, (2, 32)),
}

# (text config class, multimodal config class, the text tower's own extra fields)
_FAMILIES = {"gemma4": ("Gemma4TextConfig", "Gemma4Config", _PLE_OFF),
             "gemma4_unified": ("Gemma4UnifiedTextConfig", "Gemma4UnifiedConfig", {})}


# config.json shapes: a text model's, a multimodal one's, and a multimodal one whose
# text_config names no model_type (transformers builds the class its outer config names)
_SHAPES = ["text", "multimodal", "untyped-text-config"]
_SPELLED_OUT = object()


def _released(family: str, keys: dict, shape: str = "text", layer_types=_SPELLED_OUT) -> dict:
    """A config.json as a Gemma 4 checkpoint ships it: layer_types spelled out (unless given:
    None leaves them out), the builder keys, no per_layer_config."""
    text = {"model_type": f"{family}_text", **_TEXT, **_FAMILIES[family][2], **keys}
    if layer_types is _SPELLED_OUT:
        layer_types = ["full_attention" if i % 6 == 5 else "sliding_attention"
                       for i in range(text["num_hidden_layers"])]
    if layer_types is not None:
        text["layer_types"] = layer_types
    if shape == "text":
        return text
    if shape == "untyped-text-config":
        del text["model_type"]
    return {"model_type": family, "text_config": text, "vision_config": _VISION, "audio_config": None}


def _live(family: str, released: dict):
    text_class, multimodal_class, _ = _FAMILIES[family]
    # a copy: transformers writes into the layer_types list it is given (the last layer forced
    # full), which would mend the config.json dict under test
    fields = {k: v for k, v in copy.deepcopy(released).items() if k != "model_type"}
    if "text_config" in released:
        return getattr(transformers, multimodal_class)(**fields)
    return getattr(transformers, text_class)(**fields)


def _built_widths(config) -> dict[int, tuple[int, int]]:
    """(kv heads, head_dim) of each layer that stores K/V in the model transformers makes of
    config (random weights, CPU): k_norm spans one head, k_proj all of the layer's KV heads."""
    model = transformers.AutoModel.from_config(config)
    widths = {}
    for i, layer in enumerate(model.get_decoder().layers):
        attn = layer.self_attn
        if getattr(attn, "k_proj", None) is None:     # KV-shared: reads an earlier layer's cache
            continue
        head_dim = attn.k_norm.weight.shape[0]
        widths[i] = (attn.k_proj.weight.shape[0] // head_dim, head_dim)
    return widths


def _widths(geometry, layers) -> dict[int, tuple[int, int]]:
    return {i: (geometry.kv_heads_of(i), geometry.head_dim_of(i)) for i in layers}


def _assert_every_form_reads(built, released, config, tmp_path):
    """The geometry of each form calibration and validation meet gives the layers built."""
    config.save_pretrained(tmp_path)
    forms = {"released config.json": geometry_from_config(released), "live": geometry_from_config(config),
             "to_dict": geometry_from_config(config.to_dict()),
             "saved config.json": geometry_from_config_file(tmp_path)}
    for form, geometry in forms.items():
        assert _widths(geometry, built) == built, form
    assert all(g == forms["live"] for g in forms.values())


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("family", list(_FAMILIES))
@pytest.mark.parametrize("variant", list(_FULL_LAYER))
def test_every_form_of_the_config_gives_the_layers_the_model_builds(tmp_path, variant, family, shape):
    keys, full = _FULL_LAYER[variant]
    released = _released(family, keys, shape)
    config = _live(family, released)
    built = _built_widths(config)
    assert built == {**{i: (2, 16) for i in range(5)}, 5: full}    # the model is what the case says
    _assert_every_form_reads(built, released, config, tmp_path)


# (num_hidden_layers, layer_types as config.json gives them, None: left out; the full-attention
# layers transformers builds: Gemma4TextConfig.__post_init__ fills in every 6th layer and makes
# the last one full)
_LAYOUTS = {
    "no-layer-types": (12, None, {5, 11}),
    "no-layer-types-last-forced": (8, None, {5, 7}),
    "last-sliding": (4, ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                     {2, 3}),
}


@pytest.mark.parametrize("shape", _SHAPES[:2])
@pytest.mark.parametrize("family", list(_FAMILIES))
@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_full_layers_are_where_transformers_lays_them_out(tmp_path, layout, family, shape):
    """A config.json without layer_types, or whose last layer is a sliding one: the model's
    full layers are where its config class puts them, not where the dict says."""
    n, kinds, full = _LAYOUTS[layout]
    released = _released(family, {**_FULL_LAYER["k-eq-v"][0], "num_hidden_layers": n}, shape, kinds)
    config = _live(family, released)
    built = _built_widths(config)
    assert built == {i: (1, 32) if i in full else (2, 16) for i in range(n)}
    _assert_every_form_reads(built, released, config, tmp_path)


@pytest.mark.parametrize("family", list(_FAMILIES))
def test_kv_shared_layers_keep_their_kinds_width(family):
    """Layers past num_kv_shared_layers build no K/V projections (cache_bits leaves them out);
    the layers that do are read right around them."""
    released = _released(family, {"global_head_dim": 32, "num_global_key_value_heads": 1,
                                  "attention_k_eq_v": True, "num_hidden_layers": 12,
                                  "num_kv_shared_layers": 4})
    config = _live(family, released)
    built = _built_widths(config)
    assert sorted(built) == list(range(8)) and built[5] == (1, 32)
    for form in (released, config, config.to_dict()):
        assert _widths(geometry_from_config(form), built) == built


def test_calibrations_geometry_of_a_loaded_model_is_its_layers():
    """What validation checks a bundle against and counts bits with (model_geometry: the
    loaded model's live config)."""
    from oscar_zoo.calibrate.loading import model_geometry

    config = _live("gemma4", _released("gemma4", _FULL_LAYER["k-eq-v"][0], "multimodal"))
    model = transformers.AutoModel.from_config(config)
    built = _built_widths(config)
    assert _widths(model_geometry(model), built) == built


def test_per_layer_config_wins_over_the_global_keys():
    """transformers builds layers from per_layer_config when a config has one (its keys are
    zero-padded layer ids) and then ignores global_head_dim; a layer that restates the global
    value is not a different one."""
    g = geometry_from_config({
        "model_type": "gemma4_text", "num_hidden_layers": 12, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "global_head_dim": 512,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"],
        "per_layer_config": {"05": {"head_dim": 128, "num_key_value_heads": 2}, "11": {"head_dim": 64}}})
    assert (g.head_dim_by_layer, g.kv_heads_by_layer) == ({5: 128}, {5: 2})
    g = geometry_from_config({"model_type": "gemma4_text", "num_hidden_layers": 2, "num_attention_heads": 8,
                              "head_dim": 64, "global_head_dim": 512, "per_layer_config": {},
                              "layer_types": ["sliding_attention", "full_attention"]})
    assert g.head_dim_by_layer == {}


@pytest.mark.parametrize("family", list(_FAMILIES))
def test_kv_shared_layers_are_listed_at_the_width_of_the_cache_they_read(family):
    """layers() lists KV-shared layers too (a bundle carries tensors for every layer it lists),
    and validation hands each the K/V of the layer it reads (transformers' shared_kv_states)
    beside its own queries: its head_dim and KV heads must be that layer's, and its queries'."""
    released = _released(family, {"global_head_dim": 32, "num_global_key_value_heads": 1,
                                  "attention_k_eq_v": True, "num_hidden_layers": 12,
                                  "num_kv_shared_layers": 4})
    config = _live(family, released)
    text = config.get_text_config()
    modes, kinds = text.kv_sharing_modes, text.layer_types
    store = {kinds[i]: i for i, mode in enumerate(modes) if mode == "store"}
    sources = {i: store[kinds[i]] for i, mode in enumerate(modes) if mode == "reuse"}
    assert sources == {8: 7, 9: 7, 10: 7, 11: 5}
    layers = transformers.AutoModel.from_config(config).get_decoder().layers
    for form in (released, config, config.to_dict()):
        geometry = geometry_from_config(form)
        assert geometry.layers() == list(range(12))
        for shared, source in sources.items():
            query_dim = layers[shared].self_attn.q_norm.weight.shape[0]
            assert geometry.head_dim_of(shared) == geometry.head_dim_of(source) == query_dim
            assert geometry.kv_heads_of(shared) == geometry.kv_heads_of(source)
