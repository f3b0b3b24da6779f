"""KV-shared layers (Gemma 3n, Gemma 4) in validation's INT2-cache emulation, on tiny random
text models built from configs (no downloads).

A serving engine stores each K/V once, quantized with the rotation, key mean and clips of the
layer that wrote it (the source); a layer past num_kv_shared_layers reads that same stored cache.
transformers hands such a layer the source layer's own K/V tensors (shared_kv_states), so the
emulation saw the source's BF16 K/V and quantized them a second time with the reading layer's
own bundle tensors: a cache no engine holds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from oscar_zoo.calibrate import capture, validate as validate_module
from oscar_zoo.calibrate.data import TextSource
from oscar_zoo.calibrate.int2_attention import kernel_quantizer
from oscar_zoo.calibrate.loading import model_geometry
from oscar_zoo.calibrate.validate import ValidationConfig, validate
from oscar_zoo.zoo.bundle import Bundle
from oscar_zoo.zoo.errors import InvalidInput
from oscar_zoo.zoo.manifest import Geometry
from tests.calibrate.reference import int2_f64
from tests.utils.bundles import make_manifest, make_tensors

transformers = pytest.importorskip("transformers")

SINK, RECENT, WINDOW, T, GROUP = 4, 8, 16, 48, 32
# two sliding, one full, then three layers that read the last sliding one's (1) and the full
# one's (2) cache: layers 3 and 4 both read layer 1's
KINDS = ["sliding_attention", "sliding_attention", "full_attention"] * 2
SHARED = 3
# head_dim 64: the kernels' least
_COMMON = dict(vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=WINDOW,
               layer_types=KINDS, num_kv_shared_layers=SHARED, max_position_embeddings=256,
               initializer_range=0.1)


def _gemma3n():
    config = transformers.Gemma3nTextConfig(
        **_COMMON, vocab_size_per_layer_input=128, hidden_size_per_layer_input=8, laurel_rank=4,
        altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 6)
    return transformers.Gemma3nForCausalLM(config)


def _gemma4():
    # per-layer inputs on, as in the Gemma 4 models that share KV (E2B, E4B): without them this
    # transformers fails before the shared layers (_maybe_slice_kv_shared_inputs); full layers
    # twice as wide as the sliding ones
    config = transformers.Gemma4TextConfig(**_COMMON, global_head_dim=128, hidden_size_per_layer_input=8,
                                           vocab_size_per_layer_input=128)
    return transformers.Gemma4ForCausalLM(config)


MODELS = {"gemma3n": _gemma3n, "gemma4": _gemma4}


def _model(family: str):
    torch.manual_seed(0)
    model = MODELS[family]().eval()
    capture.install(model)
    return model


def _sources(model) -> dict[int, int]:
    return _modes_sources(model.config)


def _modes_sources(config) -> dict[int, int]:
    """transformers' own answer: each "reuse" layer reads the "store" layer of its kind."""
    text = config.get_text_config()
    modes, kinds = text.kv_sharing_modes, text.layer_types
    store = {kinds[i]: i for i, mode in enumerate(modes) if mode == "store"}
    return {i: store[kinds[i]] for i, mode in enumerate(modes) if mode == "reuse"}


def _bundle(model, seed: int = 0) -> Bundle:
    """Random per-head rotations, key means and clips, different on every layer, for `model`."""
    m = make_manifest("smollm2-135m", per_head=True, centered=True)
    m = m.model_copy(update={
        "geometry": Geometry.of(model_geometry(model)),
        "quantization": m.quantization.model_copy(update={"sink_tokens": SINK, "recent_tokens": RECENT,
                                                          "group_size": GROUP})})
    bundle = Bundle(m, *make_tensors(m, seed))
    g = torch.Generator().manual_seed(seed)
    for lid in bundle.layers:
        bundle.k[lid].clip[:] = (0.7 + 0.3 * torch.rand(2, generator=g)).numpy()
        bundle.v[lid].clip[:] = (0.7 + 0.3 * torch.rand(2, generator=g)).numpy()
    return bundle


def _consistent(bundle: Bundle, sources: dict[int, int]) -> Bundle:
    """bundle with every shared layer carrying its source's tensors, as calibration writes it."""
    for shared, source in sources.items():
        bundle.k[shared], bundle.v[shared] = bundle.k[source], bundle.v[source]
    return bundle


def _allow_drift(monkeypatch):
    """validate() refuses a bundle whose shared layers carry their own tensors (tested below);
    the emulation tests here give them their own on purpose, so that reading the source's
    cache shows: with the same tensors, quantizing twice would give the same rows."""
    monkeypatch.setattr(validate_module, "check_kv_shared_tensors", lambda bundle, sources: None)


def _window() -> list[int]:
    return torch.randint(0, 128, (T,), generator=torch.Generator().manual_seed(1)).tolist()


def _validate(model, bundle):
    """validate() on one window of T random tokens, the bundle alone (no baselines)."""
    return validate(bundle, model, None, ValidationConfig(context_len=T, windows=1, baselines=()),
                    kernel_quantizer(device="cpu"),
                    held_out=(TextSource("random tokens", "", "0" * 64), [_window()]))


def test_the_tiny_models_share_as_the_test_assumes():
    for family in MODELS:
        model = _model(family)
        assert _sources(model) == {3: 1, 4: 1, 5: 2}, family


@pytest.mark.parametrize("family", list(MODELS))
def test_a_shared_layer_reads_the_int2_cache_its_source_layer_wrote(family, monkeypatch):
    """Per layer, the K/V the emulated attention reads from the INT2 tier in an INT2 pass: a
    shared layer's must be its source layer's, bit for bit (one stored cache), and not BF16."""
    model = _model(family)
    read: dict[int, tuple] = {}
    layer = [None]
    replace, attention = validate_module._replace_observer, validate_module.mixed_attention

    def recording_replace(*args, **kwargs):
        inner = replace(*args, **kwargs)

        def observer(module, *rest):
            layer[0] = module.layer_idx
            try:
                return inner(module, *rest)
            finally:
                layer[0] = None
        return observer

    def recording_attention(q, k, v, allowed, scaling, k_int2, v_int2, *rest, **kw):
        if layer[0] is not None:
            read[layer[0]] = (k, v, k_int2, v_int2)
        return attention(q, k, v, allowed, scaling, k_int2, v_int2, *rest, **kw)

    monkeypatch.setattr(validate_module, "_replace_observer", recording_replace)
    monkeypatch.setattr(validate_module, "mixed_attention", recording_attention)
    _allow_drift(monkeypatch)
    _validate(model, _bundle(model))
    assert sorted(read) == list(range(6))
    for shared, source in _sources(model).items():
        k, v, k_int2, v_int2 = read[shared]
        assert k is read[source][0] and v is read[source][1]      # transformers hands it the source's
        assert not torch.equal(k_int2, k) and not torch.equal(v_int2, v)   # INT2, not BF16
        assert torch.equal(k_int2, read[source][2]), (shared, source)
        assert torch.equal(v_int2, read[source][3]), (shared, source)


# --- the whole measurement against an independent float64 emulation --------------------------

def _attention_f64(q, k, v, k2, v2, scaling, window):
    """One query at a time: causal, within `window` keys (None: all) as transformers'
    sliding_window_overlay (kv_idx > q_idx - window); key j from BF16 when j < SINK or
    i - j < RECENT, else from k2 / v2 ([T, H, d])."""
    _, hq, t, d = q.shape
    g = hq // k.shape[1]
    out = torch.zeros(1, t, hq, d, dtype=torch.float64)
    for i in range(t):
        j = torch.arange(max(0, i - window + 1) if window else 0, i + 1)
        fp = ((j < SINK) | (i - j < RECENT))[:, None]
        for h in range(hq):
            kk = torch.where(fp, k[0, h // g, j].double(), k2[j, h // g])
            vv = torch.where(fp, v[0, h // g, j].double(), v2[j, h // g])
            out[0, i, h] = torch.softmax(kk @ q[0, h, i].double() * scaling, 0) @ vv
    return out


@pytest.mark.parametrize("family", list(MODELS))
def test_validation_of_a_kv_shared_model_matches_a_float64_reference(family, monkeypatch):
    """Extra loss, KL and per-layer attention error of the bundle, against the same cache done
    in float64 one query at a time, each shared layer reading its source layer's INT2 K/V."""
    model = _model(family)
    bundle = _bundle(model)
    _allow_drift(monkeypatch)
    report = _validate(model, bundle)
    owner = {lid: _sources(model).get(lid, lid) for lid in range(6)}

    def int2(lid, k, v):
        src = owner[lid]
        t = lambda a: torch.from_numpy(a)  # noqa: E731
        ks, vs = bundle.k[src], bundle.v[src]
        return (int2_f64(k[0].transpose(0, 1), t(ks.rotation), t(ks.clip), GROUP, t(ks.mean)),
                int2_f64(v[0].transpose(0, 1), t(vs.rotation), t(vs.clip), GROUP, None))

    def attend(module, q, k, v, kw, k2, v2):
        return _attention_f64(q, k, v, k2, v2, kw["scaling"], getattr(module, "sliding_window", None))

    errors = {}

    def measure(module, q, k, v, mask, kw):     # teacher-forced, on positions past the windows
        exact = attend(module, q, k, v, kw, k[0].transpose(0, 1).double(),
                       v[0].transpose(0, 1).double())
        o = attend(module, q, k, v, kw, *int2(module.layer_idx, k, v))
        exact, o = exact[:, SINK + RECENT:], o[:, SINK + RECENT:]
        errors[module.layer_idx] = float(((o - exact) ** 2).sum() / (exact ** 2).sum()) ** 0.5

    def replace(module, q, k, v, mask, kw):
        return attend(module, q, k, v, kw, *int2(module.layer_idx, k, v)).to(q.dtype)

    ids = torch.tensor([_window()])
    targets = ids[0, 1:, None]
    with torch.no_grad():
        with capture.observing(measure):
            ref = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].double(), -1)
        with capture.observing(replace):
            lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].double(), -1)
    delta = float(ref.gather(1, targets).mean() - lp.gather(1, targets).mean())
    kl = float((ref.exp() * (ref - lp)).sum(-1).mean())
    (ours,) = report.variants
    assert ours.name == "bundle"
    assert ours.per_layer_attn_rel_error == pytest.approx([errors[i] for i in range(6)], rel=1e-4)
    assert ours.delta_nll == pytest.approx(delta, rel=1e-3, abs=1e-5)
    assert ours.kl == pytest.approx(kl, rel=1e-3, abs=1e-6)


# --- a bundle whose shared layers carry other tensors than their source's ---------------------

# per field the refusal names: (side, SideTensors field, a change that keeps it a valid tensor)
_DRIFTS = {
    "rotation K": ("k", "rotation", lambda r: r[..., ::-1, :].copy()),     # rows swapped
    "rotation V": ("v", "rotation", lambda r: -r),
    "key mean": ("k", "mean", lambda m: m + 1e-3),
    "clip K": ("k", "clip", lambda c: c * 0.99),
    "clip V": ("v", "clip", lambda c: c * 0.99),
}


def _drifted(model, layer: int, field: str) -> Bundle:
    """A consistent bundle, but `layer` (a shared one) carries `field` changed."""
    bundle = _consistent(_bundle(model), _sources(model))
    side, attr, change = _DRIFTS[field]
    tensors = getattr(bundle, side)
    tensors[layer] = dataclasses.replace(tensors[layer], **{attr: change(getattr(tensors[layer], attr))})
    return bundle


@pytest.mark.parametrize("field", list(_DRIFTS))
def test_kv_shared_drift_names_each_field_that_differs_and_nothing_else(field):
    from oscar_zoo.calibrate.cache_bits import kv_shared_drift

    model = _model("gemma4")
    assert kv_shared_drift(_consistent(_bundle(model), _sources(model)), _sources(model)) == {}
    assert kv_shared_drift(_drifted(model, 4, field), _sources(model)) == {4: [field]}


def test_a_key_mean_on_the_reader_only_is_drift():
    from oscar_zoo.calibrate.cache_bits import kv_shared_drift

    model = _model("gemma3n")
    bundle = _consistent(_bundle(model), _sources(model))
    bundle.k[5] = dataclasses.replace(bundle.k[5], mean=None)
    assert kv_shared_drift(bundle, _sources(model)) == {5: ["key mean"]}


@pytest.mark.parametrize("family", list(MODELS))
def test_validate_refuses_a_bundle_whose_shared_layers_carry_their_own_tensors(family, monkeypatch):
    """Bundles calibrated before readers got their source's tensors (or converted, hand-made)
    carry their own: validation read the source's and reported good numbers for a bundle an
    engine, which looks tensors up by layer id, serves with the wrong rotations. Refused before
    any forward, naming the layers, the fields and the fix; a consistent bundle validates."""
    model = _model(family)
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(InvalidInput) as e:
        _validate(model, _bundle(model))
    said = str(e.value)
    assert ("rotation K, rotation V, key mean, clip K, clip V on layers 3 (source 1), "
            "4 (source 1), 5 (source 2).") in said
    assert "recalibrate with this version" in said and "oscar-zoo calibrate" in said
    with pytest.raises(InvalidInput, match=r"read: clip V on layer 4 \(source 1\)\."):
        _validate(model, _drifted(model, 4, "clip V"))
    monkeypatch.undo()
    (ours,) = _validate(model, _consistent(_bundle(model), _sources(model))).variants
    assert ours.name == "bundle"


# --- which layer's cache a shared layer reads, from its config ---------------------------------

@pytest.mark.parametrize("make", [
    lambda: transformers.Gemma3nTextConfig(num_hidden_layers=10, num_kv_shared_layers=4),
    lambda: transformers.Gemma3nTextConfig(num_hidden_layers=12, num_kv_shared_layers=7),
    lambda: transformers.Gemma4TextConfig(num_hidden_layers=12, num_kv_shared_layers=4),
    lambda: transformers.Gemma4Config(text_config={"num_hidden_layers": 12, "num_kv_shared_layers": 4}),
    lambda: transformers.Gemma4TextConfig(num_hidden_layers=6),
    lambda: transformers.LlamaConfig(num_hidden_layers=3),
], ids=["gemma3n", "gemma3n-one-full-source", "gemma4-text", "gemma4-multimodal", "gemma4-unshared",
        "llama"])
def test_kv_sources_are_the_layers_transformers_stores_for_them(make):
    from oscar_zoo.calibrate.cache_bits import kv_shared_layers, kv_sources

    config = make()
    expected = _modes_sources(config) if hasattr(config.get_text_config(), "kv_sharing_modes") else {}
    assert kv_sources(config) == expected
    assert kv_sources(config.to_dict()) == expected
    assert set(expected) == kv_shared_layers(config)


def test_a_model_whose_every_layer_reads_another_models_cache_is_named():
    """Gemma 4 assistant models share every layer: they read the target model's cache."""
    from oscar_zoo.calibrate.cache_bits import kv_sources
    from oscar_zoo.zoo.errors import UnsupportedModelError

    config = transformers.Gemma4TextConfig(num_hidden_layers=6, num_kv_shared_layers=6)
    with pytest.raises(UnsupportedModelError, match="validate the target model"):
        kv_sources(config)


@pytest.mark.parametrize("family", list(MODELS))
def test_every_variant_gives_a_shared_layer_its_source_layers_cache(family):
    """stored_once over every variant, per-layer clips included: bundle-served (one K / V pair,
    the bundle's rotations and key means) and oscar-shipped differ per layer too, unlike the
    data-free baselines, so each must be the source's own settings object."""
    from oscar_zoo.calibrate.validate import BASELINES, SERVED, stored_once, variant_specs
    from oscar_zoo.zoo.manifest import Clip

    model = _model(family)
    bundle = _bundle(model)
    per_layer = Clip(granularity="layer", k_global=0.9, v_global=0.88, k_min=0.8, k_median=0.9,
                     k_max=1.0, v_min=0.8, v_median=0.88, v_max=1.0)
    bundle = Bundle(bundle.manifest.model_copy(update={"clip": per_layer}), bundle.k, bundle.v)
    specs = stored_once(variant_specs(bundle, tuple(BASELINES)), _sources(model))
    assert set(specs) == {"bundle", SERVED, *BASELINES}
    for name, layers in specs.items():
        for shared, source in _sources(model).items():
            assert layers[shared] is layers[source], (name, shared)
        assert layers[0] is not layers[1] or name in ("hadamard", "naive")


@pytest.mark.parametrize("make", [
    lambda: transformers.Gemma3nTextConfig(num_hidden_layers=10, num_kv_shared_layers=4),
    lambda: transformers.Gemma4TextConfig(num_hidden_layers=12, num_kv_shared_layers=4),
], ids=["gemma3n", "gemma4"])
def test_a_config_json_without_layer_types_reads_the_ones_its_class_fills_in(make):
    """Gemma 3n's config class fills in layer_types where config.json has none (every 5th layer
    full): read as all full, its shared layers all named the last unshared layer."""
    from oscar_zoo.calibrate.cache_bits import kv_sources

    config = make()
    released = config.to_dict()
    del released["layer_types"]
    assert kv_sources(released) == _modes_sources(config)
