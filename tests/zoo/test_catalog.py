"""Model catalog and geometry: names resolve, unknown names get suggestions, configs give geometry."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.zoo.catalog import (ALIAS_NAME, CATALOG, is_hub_id, lookup, resolve, suggest,
                                   version_number)
from oscar_zoo.zoo.errors import InvalidInput, ModelNotFound, UnsupportedModelError
from oscar_zoo.zoo.geometry import geometry_from_config

REQUIRED = ["glm-4.7-fp8", "qwen3-4b-thinking-2507", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b",
            "minimax-m2.7", "qwen3.5-4b", "qwen3.5-35b-a3b", "gemma-4-12b", "smollm2-135m"]


def test_catalog_has_the_required_models():
    assert set(REQUIRED) <= {e.name for e in CATALOG}
    assert lookup("glm-4.7-fp8").hub_id == "zai-org/GLM-4.7-FP8"


@pytest.mark.parametrize("name", ["glm-4.7-fp8", "GLM-4.7-FP8", "zai-org/GLM-4.7-FP8", " glm-4.7 "])
def test_every_spelling_resolves_to_one_entry(name):
    assert lookup(name).name == "glm-4.7-fp8"


def test_names_are_unambiguous():
    seen = {}
    for entry in CATALOG:
        for n in entry.names:
            assert n not in seen, f"{n} names both {seen[n]} and {entry.name}"
            seen[n] = entry.name


def test_unknown_model_gets_did_you_mean():
    with pytest.raises(ModelNotFound) as e:
        lookup("qwen3-8")
    assert "qwen3-8b" in e.value.suggestions and "Did you mean" in str(e.value)
    assert suggest("glm4.7fp8")[0] == "glm-4.7-fp8"


def test_rotationzoo_locations():
    assert lookup("qwen3-8b").zoo.folder == "Qwen3-8B/seq20000_prompt83_group128"
    assert lookup("qwen3-30b-a3b").zoo.per_head
    assert lookup("qwen3.5-35b-a3b").geometry.layers() == list(range(3, 40, 4))
    assert lookup("smollm2-135m").zoo is None


def test_geometry_from_plain_config():
    g = geometry_from_config({"num_hidden_layers": 36, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "hidden_size": 4096})
    assert (g.num_layers, g.head_dim, g.group_size, g.layers()[-1]) == (36, 128, 4, 35)


def test_geometry_of_hybrid_and_gemma_like_configs():
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    g = geometry_from_config({"text_config": {"num_hidden_layers": 8, "num_attention_heads": 16,
                              "num_key_value_heads": 2, "head_dim": 256, "layer_types": kinds * 2}})
    assert g.layers() == [3, 7]
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    g = geometry_from_config({"num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 4,
                              "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
                              "layer_types": kinds * 2})
    assert g.layers() == list(range(12)) and g.head_dim_of(5) == 512 and g.head_dim_of(4) == 256
    assert g.kv_heads_of(11) == 2 and g.kv_heads_of(0) == 4


def test_mla_is_refused_with_a_reason():
    with pytest.raises(UnsupportedModelError, match="latent attention"):
        geometry_from_config({"num_hidden_layers": 4, "num_attention_heads": 8, "kv_lora_rank": 512})


def test_unknown_model_geometry_comes_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}))
    entry = resolve("acme/tiny-lm", tmp_path)
    assert entry.hub_id == "acme/tiny-lm" and entry.geometry.num_kv_heads == 2
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve("acme/tiny-lm")


def _config_of(g) -> dict:
    return {"num_hidden_layers": g.num_layers, "num_attention_heads": g.num_q_heads,
            "num_key_value_heads": g.num_kv_heads, "head_dim": g.head_dim}


@pytest.mark.parametrize("name", ["glm-4.7-fp8", "qwen3-8b"])
def test_a_known_models_config_keeps_its_catalog_settings(tmp_path, name):
    """The entry was rebuilt positionally: `gpus` landed in the `lloyd_max` slot (so every such
    convert asked for Lloyd-Max buckets) and the real gpus, lloyd_max and notes were dropped."""
    known = lookup(name)
    (tmp_path / "config.json").write_text(json.dumps(_config_of(known.geometry)))
    entry = resolve(name, tmp_path / "config.json")
    assert entry.geometry == known.geometry
    for field in ("gpus", "lloyd_max", "k_clip", "v_clip", "group_size", "sink_tokens",
                  "recent_tokens", "notes", "zoo", "aliases", "architecture"):
        assert getattr(entry, field) == getattr(known, field), field


def test_a_config_of_another_model_is_refused_for_a_known_one(tmp_path):
    other = {**_config_of(lookup("qwen3-8b").geometry), "num_key_value_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(other))
    with pytest.raises(InvalidInput, match="describes another model than qwen3-8b") as e:
        resolve("qwen3-8b", tmp_path / "config.json")
    assert "8 KV heads" in str(e.value) and "4 KV heads" in str(e.value)


@pytest.mark.parametrize("model,hub", [("Qwen/Qwen3-8B", True), ("qwen3-8b", False),
                                       ("Qwen/Qwen3-8B\n", False), ("a/b/c", False)])
def test_is_hub_id_takes_the_whole_string(model, hub):
    # `$` would match before a final newline, and a hub id with one names no repository
    assert is_hub_id(model) is hub


@pytest.mark.parametrize("ref,number", [("3", 3), ("v3", 3), ("v007", 7), ("0", 0),
                                        ("V3", None), ("v", None), ("", None), ("vv3", None),
                                        ("v3a", None), ("3v", None), (" 3", None),
                                        ("v3\n", None), ("٣", None), ("prod", None)])
def test_a_version_is_named_by_its_number_with_or_without_v(ref, number):
    """The one rule of NAME@3 and NAME@v3 (pull's refs, the registry's): ASCII digits only
    ('٣' is a digit to str.isdigit and to \\d, and int() reads it as 3)."""
    assert version_number(ref) == number


def test_a_ref_too_long_for_a_version_number_is_refused_in_words():
    with pytest.raises(InvalidInput, match="at most 18 digits"):
        version_number("v" + "9" * 5000)


@pytest.mark.parametrize("name", ["v3", "v0", "v12345"])
def test_no_alias_is_spelled_as_a_version(name):
    assert version_number(name) is not None and not ALIAS_NAME.fullmatch(name)
    assert ALIAS_NAME.fullmatch(name + "x") and ALIAS_NAME.fullmatch("v")
