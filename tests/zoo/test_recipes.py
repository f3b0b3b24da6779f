"""Serving recipes against what OSCAR's SGLang actually reads (oscar-spec 1.8, 3.5, 4.4, 7.5)."""

from __future__ import annotations

import numpy as np
import pytest

from oscar_zoo.zoo.catalog import lookup
from oscar_zoo.zoo.interop import oscar_pt
from oscar_zoo.zoo.interop.convert import ServingDefaults, bundle_from_oscar
from oscar_zoo.zoo.recipes import sglang_recipe


def _manifest(model: str, per_head: bool = False):
    """An imported bundle's manifest for a catalog model (identity rotations: only the
    manifest matters here)."""
    entry = lookup(model)
    geo = entry.geometry
    files = []
    for objective in ("qqt_r_h_pbr", "sst_r_h_pbr"):
        f = oscar_pt.OscarFile(2 if per_head else 1, objective, "layer")
        for lid in geo.layers():
            d, h = geo.head_dim_of(lid), geo.kv_heads_of(lid)
            rot = np.eye(d, dtype=np.float32)
            f.layers[lid] = oscar_pt.OscarLayer(np.broadcast_to(rot, (h, d, d)).copy() if per_head else rot)
        files.append(f)
    return bundle_from_oscar(*files, entry, ServingDefaults.of(entry), "test").manifest


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3.5-35b-a3b", "glm-4.7-fp8"])
def test_the_sink_and_recent_windows_are_switched_on(model):
    """SGLang builds the BF16 sink/recent tiers only with SGLANG_ENABLE_MIXED_KV_WINDOWS=1
    (EnvBool(False) in environ.py; OSCAR's README and every eval script set it). Without it
    the PREFIX/RECENT variables are read by nothing and the whole cache is INT2."""
    env = sglang_recipe(_manifest(model), "k.pt", "v.pt").env
    assert env["SGLANG_ENABLE_MIXED_KV_WINDOWS"] == "1"


@pytest.mark.parametrize("model, absorb", [
    ("qwen3-8b", "1"),          # qwen3.py folds R_v into qkv_proj (oscar-spec 4.4)
    ("glm-4.7-fp8", "1"),       # glm4_moe.py, per-channel FP8: OSCAR's paper configuration
    ("minimax-m2.7", "0"),      # block-FP8 weights: absorption refuses them; OSCAR serves it with 0
    ("smollm2-135m", "0"),      # no absorption hook for this architecture
])
def test_v_absorption_only_where_the_model_code_supports_it(model, absorb):
    env = sglang_recipe(_manifest(model), "k.pt", "v.pt").env
    assert env["SGLANG_OSCAR_ABSORB_V_ROTATION"] == absorb


def test_absorption_stays_off_for_per_head_rotations_of_a_model_that_absorbs():
    m = _manifest("qwen3-8b", per_head=True)
    assert sglang_recipe(m, "k.pt", "v.pt").env["SGLANG_OSCAR_ABSORB_V_ROTATION"] == "0"


def test_a_hybrid_model_is_launched_without_the_radix_cache():
    """INT2 forces --page-size 8 and Qwen3.5's MambaRadixCache asserts page size 1, which
    surfaces as an illegal memory access (oscar-spec 7.5; OSCAR rotation/run/_common.sh)."""
    hybrid = sglang_recipe(_manifest("qwen3.5-35b-a3b"), "k.pt", "v.pt")
    assert "--disable-radix-cache" in hybrid.command
    assert any("radix" in n for n in hybrid.notes)
    dense = sglang_recipe(_manifest("qwen3-8b"), "k.pt", "v.pt")
    assert "--disable-radix-cache" not in dense.command


def test_a_manifest_without_an_architecture_falls_back_to_the_catalogs():
    m = _manifest("qwen3-8b").model_dump(mode="json")
    m["model"]["architecture"] = None
    assert sglang_recipe(m, "k.pt", "v.pt").env["SGLANG_OSCAR_ABSORB_V_ROTATION"] == "1"


def _validated(model: str, quantizer: str | None) -> dict:
    """The manifest as bundle.json holds it, with a validation report that simulated
    `quantizer` (None: a report written before reports said; only its field matters here)."""
    m = _manifest(model).model_dump(mode="json")
    m["validation"] = {"passed": True} | ({} if quantizer is None else {"quantizer": quantizer})
    return m


def test_a_lloyd_max_validated_bundle_is_not_told_to_drop_the_variable():
    """The note said oscar-zoo's validation measures uniform INT2 and to drop SGLANG_LLOYD_MAX
    to serve what it measured; a bundle validated with Lloyd-Max buckets was not."""
    recipe = sglang_recipe(_validated("minimax-m2.7", "lloyd_max"), "k.pt", "v.pt")
    assert recipe.env["SGLANG_LLOYD_MAX"] == "1"
    note = next(n for n in recipe.notes if "SGLANG_LLOYD_MAX" in n)
    assert "simulated Lloyd-Max buckets for every INT2 token" in note
    assert "decoded tokens uniform" in note and "oscar-spec 5" in note
    assert "serves uniform INT2, which this bundle was not validated with" in note
    assert "drop the variable to serve" not in note


@pytest.mark.parametrize("quantizer", ["uniform", None])
def test_a_uniform_validated_lloyd_max_bundle_says_its_report_measured_uniform(quantizer):
    recipe = sglang_recipe(_validated("qwen3.5-35b-a3b", quantizer), "k.pt", "v.pt")
    note = next(n for n in recipe.notes if "SGLANG_LLOYD_MAX" in n)
    assert "validation report measured uniform INT2" in note and "Lloyd-Max buckets for every" not in note


def test_an_unvalidated_lloyd_max_bundle_claims_no_measurement():
    recipe = sglang_recipe(_manifest("minimax-m2.7"), "k.pt", "v.pt")
    note = next(n for n in recipe.notes if "SGLANG_LLOYD_MAX" in n)
    assert "no validation report" in note and "measure" not in note


@pytest.mark.parametrize("update, why", [
    ({"quantization": {"group_size": 64}}, "group size 64 is below head_dim 128"),
    ({"clip": {"k_global": 0.0, "v_global": 0.0}}, "both clip ratios are 0"),
])
def test_a_lloyd_max_bundle_sglang_would_serve_uniform_is_not_told_it_serves_lloyd_max(update, why):
    """oscar-spec 5: SGLang applies SGLANG_LLOYD_MAX=1 only in its single-scale clip kernel. A
    bundle with smaller groups, or no clip, is served uniform INT2 whatever the variable says;
    the note claimed Lloyd-Max buckets and (with a uniform report) told to drop the variable."""
    m = _validated("minimax-m2.7", "uniform")
    for section, fields in update.items():
        m[section].update(fields)
    recipe = sglang_recipe(m, "k.pt", "v.pt")
    assert "SGLANG_LLOYD_MAX" not in recipe.env
    note = next(n for n in recipe.notes if "SGLANG_LLOYD_MAX" in n)
    assert why in note and "served uniform INT2" in note
    assert "Lloyd-Max buckets when a prefill" not in note and "drop the variable" not in note


def test_vllm_is_told_what_its_port_does_not_apply():
    """vLLM's OSCAR loader reads each layer's rotation only and quantizes uniform INT2: its
    recipe said nothing when a bundle's key centering, Lloyd-Max buckets or searched per-layer
    clips (all of which the SGLang recipe covers) would not be served."""
    from oscar_zoo.zoo.recipes import vllm_recipe

    m = _validated("minimax-m2.7", "lloyd_max")
    m["method"]["key_centering"] = True
    m["clip"].update(granularity="layer", searched=True)
    notes = vllm_recipe(m, "k.pt", "v.pt").notes
    assert any("centers keys" in n and "ignores" in n for n in notes)
    assert any("Lloyd-Max" in n and "uniform INT2 only" in n for n in notes)
    assert any("searched per layer; vLLM takes one K and one V ratio" in n for n in notes)
    plain = " ".join(vllm_recipe(_manifest("qwen3-8b"), "k.pt", "v.pt").notes)
    assert "centers keys" not in plain and "Lloyd-Max" not in plain and "searched" not in plain
    assert any("searched per layer; SGLang takes one" in n for n in sglang_recipe(m, "k", "v").notes)


def test_the_layer_note_names_the_layers_held_and_is_left_out_for_all_of_them():
    """Layers 0, 2 and 4 were told as "layers 0-4 only", and a --layers list of every layer
    (0-35) as one pipeline stage's share of them."""
    m = _manifest("qwen3-8b")
    note = next(n for n in sglang_recipe(m, "k", "v", layers=[0, 2, 4]).notes if "only" in n)
    assert "hold layers 0,2,4 only (3 layers" in note
    assert "0-17 only" in " ".join(sglang_recipe(m, "k", "v", layers=list(range(18))).notes)
    assert not any("pipeline" in n for n in sglang_recipe(m, "k", "v", layers=list(range(36))).notes)
    hybrid = _manifest("qwen3.5-35b-a3b")
    assert not any("pipeline" in n for n in
                   sglang_recipe(hybrid, "k", "v", layers=list(range(3, 40, 4))).notes)


@pytest.mark.parametrize("recipe", ["sglang", "vllm"])
def test_the_layer_note_of_one_layer_says_layer(recipe):
    """`pull smollm2-135m --layers 29 --format vllm` said "layers 29 only (1 layers, ...)"."""
    from oscar_zoo.zoo import recipes

    m = _manifest("qwen3-8b")
    notes = getattr(recipes, f"{recipe}_recipe")(m, "k", "v", layers=[29]).notes
    note = next(n for n in notes if "pipeline" in n)
    assert note.startswith("These files hold layer 29 only (1 layer, by global id)"), note


@pytest.mark.parametrize("sink, recent, odd", [(64, 256, None), (20, 256, "sink 20"), (64, 100, "recent 100")])
def test_windows_that_are_not_whole_int2_pages_are_named(sink, recent, odd):
    """SGLang's pool asserts that both BF16 windows are multiples of its 8-token INT2 page
    (oscar-spec 3.5): the recipe gave windows of other sizes without a word, and the server
    then refused to start."""
    m = _manifest("qwen3-8b")
    m = m.model_copy(update={"quantization": m.quantization.model_copy(
        update={"sink_tokens": sink, "recent_tokens": recent})})
    notes = [n for n in sglang_recipe(m, "k.pt", "v.pt").notes if "INT2 page" in n]
    if odd is None:
        assert notes == []
    else:
        assert len(notes) == 1 and odd in notes[0] and "refuses to start" in notes[0], notes
        fit = f"e.g. sink {sink // 8 * 8}, recent {recent // 8 * 8}"
        assert fit in notes[0], notes
