"""Validation (calibrate/validate.py): held-out windows, the checks made before any forward, the
verdict, and the whole measurement against an independent float64 reference on the test model."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

from oscar_zoo.calibrate import capture
from oscar_zoo.calibrate.data import load_text
from oscar_zoo.calibrate.int2_attention import bundle_quantizer, kernel_quantizer
from oscar_zoo.calibrate.validate import (BUILTIN, ValidationConfig, check_held_out, eval_windows,
                                          validate)
from oscar_zoo.zoo.bundle import Bundle
from oscar_zoo.zoo.errors import InvalidInput
from tests.calibrate.reference import int2_f64
from tests.utils.bundles import make_manifest, make_tensors


class _NoBos:
    """The test model's tokenizer as a config that asks for a BOS token but defines none (a
    stand-in: no such tokenizer is available offline)."""
    add_bos_token = True
    bos_token_id = None

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **kwargs)


@pytest.mark.model
def test_windows_take_a_bos_only_where_the_tokenizer_has_one(smollm2):
    _, tok = smollm2
    held = load_text([BUILTIN], "heldout")
    _, plain = eval_windows(tok, held, 64, 3)
    _, no_bos = eval_windows(_NoBos(tok), held, 64, 3)
    assert [len(w) for w in no_bos] == [64] * 3 and all(isinstance(i, int) for w in no_bos for i in w)
    assert no_bos == plain      # the test model's own config adds no BOS either


# --- bundles for a cut of the test model ------------------------------------------------------

def _bundle(layers: int = 30, sink: int = 64, recent: int = 256, group: int = 64, per_head=False,
            centered=False, **calibration) -> Bundle:
    """A random bundle (random orthogonal rotations) for the test model's first `layers` layers."""
    m = make_manifest("smollm2-135m", per_head=per_head, centered=centered)
    m = m.model_copy(update={
        "geometry": m.geometry.model_copy(update={"num_layers": layers}),
        "quantization": m.quantization.model_copy(update={"sink_tokens": sink, "recent_tokens": recent,
                                                          "group_size": group}),
        "calibration": m.calibration.model_copy(update=calibration)})
    return Bundle(m, *make_tensors(m))


def _stand_in_model():
    """All that validate's checks read of the test model: its config. Running it fails."""
    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
              "head_dim": 64, "hidden_size": 576}
    return SimpleNamespace(config=config)


def _never(*args, **kwargs):
    raise AssertionError("the model ran for input that should have been refused")


# --- held-out text that is the calibration text ----------------------------------------------

def _calibrated_on(path) -> Bundle:
    text = load_text([str(path)], "calibration")
    return _bundle(dataset=text.name, dataset_sha256=text.sha256)


@pytest.mark.parametrize("validate_on", [["corpus.txt"], ["corpus.txt", BUILTIN]])
def test_validation_refuses_the_bundles_own_calibration_text(tmp_path, validate_on):
    """A file (or hf: dataset) has no held-out split: load_text gives its whole text to both
    calibration and validation, which then scored the bundle on the text it was fitted to."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 500)
    bundle = _calibrated_on(corpus)
    data = [str(tmp_path / d) if d == "corpus.txt" else d for d in validate_on]
    held_out = (load_text(data, "heldout"), [[1, 2, 3]])
    with pytest.raises(InvalidInput, match="is this bundle's calibration text"):
        validate(bundle, _stand_in_model(), _never, ValidationConfig(data=data, context_len=512),
                 quantizer=None, held_out=held_out)


def test_the_builtin_corpus_halves_and_other_text_are_held_out(tmp_path):
    builtin = load_text([BUILTIN], "calibration")
    check_held_out(_bundle(dataset=builtin.name, dataset_sha256=builtin.sha256), [BUILTIN], "text",
                   load_text([BUILTIN], "heldout"))
    other = tmp_path / "other.txt"
    other.write_text("held out prose " * 100)
    bundle = _bundle(dataset="corpus.txt", dataset_sha256=hashlib.sha256(b"calibration text").hexdigest())
    check_held_out(bundle, [str(other), BUILTIN], "text", load_text([str(other), BUILTIN], "heldout"))
    check_held_out(_bundle(dataset=None, dataset_sha256=None), [str(other)], "text",   # imported
                   load_text([str(other)], "heldout"))


@pytest.mark.parametrize("calibrated_on, spec", [(["a.txt", "b.txt"], False),
                                                  ([BUILTIN, "a.txt"], False),
                                                  (["a.txt", "b.txt"], True)])   # a job's bundle
@pytest.mark.parametrize("spelled", ["a.txt", "./a.txt", "absolute"])
def test_one_source_of_a_several_source_calibration_is_not_held_out(tmp_path, monkeypatch,
                                                                   calibrated_on, spec, spelled):
    """Calibrated on a.txt and b.txt (or the built-in corpus and a.txt), validated on a.txt: the
    recorded sha256 is of the joined text, so no hash matched and the bundle was scored on
    text it was fitted to."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text(f"{name} prose, different in every file. " * 200)
    text = load_text(calibrated_on, "calibration")
    bundle = _bundle(dataset=text.name, dataset_sha256=text.sha256,
                     **({"spec": {"model": "smollm2-135m", "data": calibrated_on}} if spec else {}))
    data = [str(tmp_path / "a.txt") if spelled == "absolute" else spelled]
    with pytest.raises(InvalidInput, match=r"is this bundle's calibration text or part of it"):
        check_held_out(bundle, data, "text", load_text(data, "heldout"))
    with pytest.raises(InvalidInput, match="or part of it"):      # beside held-out text too
        check_held_out(bundle, ["c.txt", *data], "text", load_text(["c.txt", *data], "heldout"))
    for other in (["c.txt"], [BUILTIN], ["c.txt", BUILTIN]):      # text calibration never read
        check_held_out(bundle, other, "text", load_text(other, "heldout"))


def test_unknown_baselines_are_refused_before_the_model_runs():
    # they made a variant with no layers, a KeyError at the first forward
    with pytest.raises(InvalidInput, match=r"unknown baselines \['hadamrd'\]"):
        validate(_bundle(), _stand_in_model(), _never,
                 ValidationConfig(context_len=512, baselines=("hadamrd", "naive")), quantizer=None)


def _lloyd_max(b: Bundle) -> Bundle:
    q = b.manifest.quantization.model_copy(update={"lloyd_max": True})
    b.manifest = b.manifest.model_copy(update={"quantization": q})
    return b


def test_lloyd_max_buckets_apply_only_with_one_group_per_row():
    # OSCAR's Lloyd-Max path is its single-scale kernel: a 2-group bundle is served uniform
    assert bundle_quantizer(_bundle(2).manifest, "cpu").kind == "uniform"
    assert bundle_quantizer(_lloyd_max(_bundle(2, group=64)).manifest, "cpu").kind == "lloyd_max"
    assert bundle_quantizer(_lloyd_max(_bundle(2, group=32)).manifest, "cpu").kind == "uniform"


@pytest.mark.parametrize("naive, passed, says", [
    (0.30, True, None),
    (0.06, False, None),                       # ours above half of naive's: failed, judged
    (-0.52, False, "naive INT2's extra loss is -0.5200 nats, no worse than BF16"),
    (0.0, False, "naive INT2's extra loss is +0.0000 nats"),
])
def test_the_verdict_names_a_naive_baseline_that_costs_nothing(naive, passed, says):
    """A cut model (BF16 loss 21 nats/token) had naive INT2 below BF16: "at most half of naive's
    extra loss" then failed every bundle under a criterion that did not say why."""
    from oscar_zoo.zoo.manifest import VariantResult, verdict

    by = {name: VariantResult(name=name, delta_nll=d, kl=0.0, attn_rel_error=0.0)
          for name, d in (("bundle", 0.04), ("hadamard", 0.2), ("naive", naive))}
    ok, criterion = verdict(by, ValidationConfig().tolerance, ValidationConfig().naive_fraction)
    assert ok is passed
    assert (says is None and "not judged" not in criterion) or (says in criterion
                                                                and "more --windows" in criterion)


@pytest.mark.parametrize("served, passed", [(0.10, True), (0.26, False)])
def test_the_verdict_judges_per_layer_clips_also_as_engines_serve_them(served, passed):
    """The verdict looked at the per-layer number only, while SGLang and vLLM serve the one K / V
    pair (bundle-served): a bundle could pass with a served loss above the Hadamard bound."""
    from oscar_zoo.zoo.manifest import VariantResult, verdict

    by = {name: VariantResult(name=name, delta_nll=d, kl=0.0, attn_rel_error=0.0)
          for name, d in (("bundle", 0.04), ("bundle-served", served), ("hadamard", 0.2),
                          ("naive", 0.6))}
    ok, criterion = verdict(by, ValidationConfig().tolerance, ValidationConfig().naive_fraction)     # bound: min(0.2 + 0.05, 0.5 x 0.6)
    assert ok is passed
    assert "as engines serve it (bundle-served)" in criterion
    assert ("failed by bundle-served" in criterion) is not passed


# --- a lossless INT2 tier costs nothing -------------------------------------------------------

def _lossless(x, rotation, clip, group_size, mean):
    """An "INT2" round trip that loses nothing: (x - mean) R in float32, as the quantizer hands
    rows back (in the rotated, centered basis)."""
    r = rotation.float().expand(x.shape[1], *rotation.shape[-2:])
    xr = torch.einsum("thd,hde->the", x.float(), r)
    return xr if mean is None else xr - torch.einsum("hd,hde->he", mean.float(), r)


def _tiny_llama():
    """A random bfloat16 2-layer Llama of the test model's head geometry (9 query heads, 3 KV
    heads, d 64; no GGUF needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=288, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         max_position_embeddings=256, initializer_range=0.1)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _tiny_run(sink=4, recent=8, group=64, scale_dtype="float32", quantizer=_lossless, model=None):
    """validate() on `model` (default _tiny_llama(): 2 layers of 3 KV heads of d 64, as the
    bundle), two windows of 64 random tokens."""
    from oscar_zoo.calibrate.data import TextSource

    model = model or _tiny_llama()
    capture.install(model)
    b = _bundle(2, sink=sink, recent=recent, group=group, per_head=True, centered=True)
    b.manifest = b.manifest.model_copy(update={
        "geometry": b.manifest.geometry.model_copy(update={"num_q_heads": 9, "num_kv_heads": 3}),
        "quantization": b.manifest.quantization.model_copy(update={"scale_dtype": scale_dtype})})
    g = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, 512, (64,), generator=g).tolist() for _ in range(2)]
    return validate(b, model, None, ValidationConfig(context_len=64, windows=2), quantizer,
                    held_out=(TextSource("random tokens", "", "0" * 64), windows))


def test_a_lossless_int2_tier_reports_no_extra_loss_on_a_bfloat16_model():
    """The BF16 reference pass ran the model's SDPA while every variant ran our attention: on a
    bfloat16 model (the GPU default) a lossless INT2 tier showed +0.002 nats and a KL of 1.6e-4,
    the two kernels' rounding, in every variant."""
    report = _tiny_run()
    assert [v.name for v in report.variants] == ["bundle", "oscar-shipped", "hadamard", "naive"]
    for v in report.variants:
        assert abs(v.delta_nll) < 1e-9 and abs(v.kl) < 1e-9, v
        assert v.delta_nll_by_set == [pytest.approx(0, abs=1e-9)] * 2
        # not exactly 0: the centered bundle's round trip, (k - mean) R R^T + mean in float32
        # and back to bfloat16, can land a key across a bfloat16 rounding boundary (with
        # transformers 5.24's initialisation one did: 3.7e-9), far below a kernel's bf16 rounding
        assert max(v.per_layer_attn_rel_error) < 1e-6, v


@pytest.mark.parametrize("kwarg", ["softcap", "s_aux"])
def test_attention_math_the_emulation_lacks_is_refused(monkeypatch, kwarg):
    """The reference pass runs the emulation's attention too (above): a model whose attention
    soft-caps its logits (Gemma 2) or adds learned sinks (gpt-oss) would be measured against a
    reference without them, in every variant alike. The stand-in: the random model's attention
    modules handed that argument."""
    from transformers.models.llama import modeling_llama

    forward = modeling_llama.LlamaAttention.forward

    def with_arg(self, *args, **kwargs):
        return forward(self, *args, **kwargs, **{kwarg: torch.ones(())})

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", with_arg)
    with pytest.raises(InvalidInput, match=f"layer 0: the model's attention takes {kwarg}"):
        _tiny_run()


@pytest.mark.parametrize("group, scale_dtype", [(64, "float32"), (32, "float16"), (64, "bfloat16")])
def test_bits_per_element_are_the_bytes_the_cache_holds(group, scale_dtype):
    """The report's bits against the bytes of the kernels' own mixed cache (Int2KVCache) holding
    one window of the run's length: codes, scale and zero in the INT2 tier; with the BF16 sink
    and recent rows over the whole cache. Rotations and the key mean are per layer, not per
    token, and are not in it."""
    from oscar_zoo.kernels import Int2KVCache

    report = _tiny_run(sink=4, recent=8, group=group, scale_dtype=scale_dtype)
    t, h, d = report.context_len, 3, 64
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(t, h, d, generator=g), torch.randn(t, h, d, generator=g)
    eye = torch.eye(d)
    cache = Int2KVCache.from_dense([k], [v], eye, eye, 0.9, 0.9, group_size=group,
                                   scale_dtype=getattr(torch, scale_dtype), sink=4, recent=8,
                                   page_size=4, mean=torch.zeros(h, d))
    nbytes = lambda *xs: sum(x.numel() * x.element_size() for x in xs)  # noqa: E731
    int2 = nbytes(cache.k_packed, cache.v_packed, cache.k_sz, cache.v_sz)
    assert report.bits_int2_tier == pytest.approx(8 * int2 / (2 * (t - 12) * h * d))
    assert report.bits_at_context == pytest.approx(8 * (int2 + nbytes(cache.hp_k, cache.hp_v)) / (2 * t * h * d))
    assert report.bits_int2_tier == 2 + 2 * (32 if scale_dtype == "float32" else 16) / group


# --- bits per element with sliding-window and KV-shared layers (cache_bits: test_cache_bits.py)

def test_a_model_with_sliding_window_layers_reports_the_bits_its_cache_holds():
    """validate() on a random 2-layer Qwen2 whose layer 1 keeps 16 tokens, at context 64 with
    sink 4 + recent 8: the report counts that layer's 16 rows, not 64, and says which layer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from oscar_zoo.zoo.cli.output import window_note
    from oscar_zoo.zoo.manifest import Validation

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=576, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                         use_sliding_window=True, sliding_window=16, max_window_layers=1,
                         initializer_range=0.1)
    report = _tiny_run(sink=4, recent=8, model=Qwen2ForCausalLM(config).to(torch.bfloat16).eval())
    assert report.window_by_layer == {"1": 16}
    assert report.bits_int2_tier == 3.0                         # fp32 scale and zero per 64
    # layer 0: 12 BF16 + 52 INT2 rows; layer 1 (positions 48..63, its sink slid out): 8 recent
    # BF16 + 8 INT2 rows; both 3 x 64 wide
    assert report.bits_at_context == pytest.approx((12 * 16 + 52 * 3.0 + 8 * 16 + 8 * 3.0) / 80)
    assert Validation.model_validate_json(report.model_dump_json()) == report
    assert window_note(report.model_dump(mode="json")) == "1 sliding-window layer holds 16 tokens"


def test_a_report_from_before_window_by_layer_loads_and_says_nothing_of_windows():
    from oscar_zoo.zoo.cli.output import window_note
    from oscar_zoo.zoo.manifest import Validation

    report = _tiny_run()                       # a Llama: no layer has a window
    written = report.model_dump(mode="json")
    # not written where no layer has a window: such a report reads as one from before the field,
    # and its manifest's bytes (its bundle's digest) are what they were
    assert "window_by_layer" not in written and "window_by_layer" not in report.model_dump_json()
    assert Validation.model_validate(written).window_by_layer == {} and window_note(written) == ""
    with pytest.raises(ValueError, match="keys must be layer ids"):
        Validation.model_validate({**written, "window_by_layer": {"layer1": 16}})
    with pytest.raises(ValueError, match="positive"):
        Validation.model_validate({**written, "window_by_layer": {"1": 0}})


def test_a_manifest_without_windows_keeps_its_canonical_bytes():
    """Manifest.to_json() is hashed into the bundle's digest, by which a re-published bundle is
    matched to its version: a manifest whose report has no windowed layer must serialize to the
    bytes it had before Validation gained window_by_layer. No manifest from before the field is
    committed to compare with, so the bytes before are made here: the same manifest dumped with
    that field excluded, which is what the model without it wrote."""
    import json

    from oscar_zoo.zoo.manifest import parse_manifest
    from tests.api.ui.seeding import validation

    m = make_manifest("smollm2-135m")
    m = m.model_copy(update={"validation": validation(30, 0)})
    assert m.validation.window_by_layer == {}
    text = m.to_json()
    before = json.dumps(m.model_dump(mode="json", exclude={"validation": {"window_by_layer"}}),
                        indent=2, sort_keys=True) + "\n"
    assert text == before and '"window_by_layer"' not in text
    assert parse_manifest(text).to_json() == text
    # with windows the key is written, and read back
    windowed = m.model_copy(update={"validation": m.validation.model_copy(
        update={"window_by_layer": {"1": 512}})})
    assert parse_manifest(windowed.to_json()).validation.window_by_layer == {"1": 512}


def test_the_serialization_schema_of_a_report_still_lists_its_fields():
    """The serializer that leaves out an empty window_by_layer wraps pydantic's own: the JSON
    schema of what is written lists every field, window_by_layer as optional."""
    from oscar_zoo.zoo.manifest import Validation

    schema = Validation.model_json_schema(mode="serialization")
    assert {"bits_at_context", "window_by_layer", "variants"} <= set(schema["properties"])
    assert "bits_at_context" in schema["required"] and "window_by_layer" not in schema["required"]


def test_a_hybrids_layers_without_a_kv_cache_are_left_out_of_the_bits():
    """A hybrid (Qwen3-Next style) has linear-attention layers with no KV cache: the whole
    cache's bits count the attention layers the geometry names, each at its own width, and
    window_by_layer names only those that slide."""
    from oscar_zoo.calibrate.cache_bits import cache_bits, layer_windows
    from oscar_zoo.calibrate.validate import _bits_at_context
    from oscar_zoo.zoo.geometry import ModelGeometry

    geometry = ModelGeometry(num_layers=4, num_q_heads=9, num_kv_heads=3, head_dim=64,
                             attention_layers=(1, 3), head_dim_by_layer={3: 128})
    config = {"num_hidden_layers": 4, "sliding_window": 16, "layer_types": [
        "linear_attention", "sliding_attention", "linear_attention", "full_attention"]}
    bits, windows = _bits_at_context(_FP32_SCALES, 64, geometry, config)
    assert windows == {"1": 16}
    # layer 1: 8 recent BF16 + 8 INT2 rows, 3 x 64 wide; layer 3: 12 BF16 + 52 INT2 rows, 3 x 128
    assert bits == pytest.approx((192 * (8 * 16 + 8 * 3.0) + 384 * (12 * 16 + 52 * 3.0))
                                 / (192 * 16 + 384 * 64), rel=1e-12)
    # the linear layers counted as full ones would lower it
    assert bits > cache_bits(3.0, 4, 8, 64, layer_windows(config), [192, 192, 192, 384]) + 0.1


# sink 4 + recent 8, an INT2 tier of 3 bits (fp32 scale and zero per 64)
_FP32_SCALES = SimpleNamespace(scale_dtype="float32", group_size=64, sink_tokens=4, recent_tokens=8)
_MISTRAL = {"num_hidden_layers": 2, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "hidden_size": 576, "sliding_window": 4096}      # Mistral 7B v0.1 style


def test_windows_as_long_as_the_context_are_left_out_of_the_report():
    """A window of context_len or more holds what a full layer holds: the report leaves it out,
    so that it reads as any full cache's, also to clients from before window_by_layer (they
    refuse a manifest carrying it). Its bits are the single-span number."""
    from oscar_zoo.calibrate.validate import _bits_at_context
    from oscar_zoo.zoo.geometry import geometry_from_config

    geometry = geometry_from_config(_MISTRAL)
    for context_len in (2048, 4096):
        bits, windows = _bits_at_context(_FP32_SCALES, context_len, geometry, _MISTRAL)
        assert windows == {} and bits == 3.0 * (1 - 12 / context_len) + 16 * 12 / context_len


def test_a_window_every_layer_shares_is_reported_where_it_binds():
    """One window on every layer, below the context: the field is still written. Without it
    the report reads as a full 8192-token cache's, though each layer holds 4096 tokens and its
    bits_at_context is that length's."""
    from oscar_zoo.calibrate.validate import _bits_at_context
    from oscar_zoo.zoo.cli.output import window_note
    from oscar_zoo.zoo.geometry import geometry_from_config

    bits, windows = _bits_at_context(_FP32_SCALES, 8192, geometry_from_config(_MISTRAL), _MISTRAL)
    assert windows == {"0": 4096, "1": 4096}
    assert bits == pytest.approx(3.0 * (1 - 8 / 4096) + 16 * 8 / 4096, rel=1e-12)   # recent only
    assert window_note({"context_len": 8192, "window_by_layer": windows}) == (
        "2 sliding-window layers hold 4096 tokens")


def test_kv_shared_layers_add_no_bits_and_no_windows():
    """Gemma 3n / Gemma 4 layers past num_kv_shared_layers read an earlier layer's cache: they
    were counted as if they held their own, at their own width and window."""
    from oscar_zoo.calibrate.validate import _bits_at_context
    from oscar_zoo.zoo.geometry import geometry_from_config

    config = {**_MISTRAL, "num_hidden_layers": 4, "sliding_window": 16, "global_head_dim": 128,
              "layer_types": ["sliding_attention", "full_attention"] * 2}
    geometry = geometry_from_config(config)
    # layers 0 and 2 slide (positions 48..63: 8 recent BF16 + 8 INT2 rows, 3 x 64 wide), 1 and
    # 3 are full (12 BF16 + 52 INT2 rows, 3 x 128 wide)
    sliding, full = (192 * (8 * 16 + 8 * 3.0), 192 * 16), (384 * (12 * 16 + 52 * 3.0), 384 * 64)
    for shared, stored, windows in [(0, (sliding, full, sliding, full), {"0": 16, "2": 16}),
                                    (1, (sliding, full, sliding), {"0": 16, "2": 16}),
                                    (2, (sliding, full), {"0": 16})]:
        got = _bits_at_context(_FP32_SCALES, 64, geometry, {**config, "num_kv_shared_layers": shared})
        assert got == (pytest.approx(sum(b for b, _ in stored) / sum(e for _, e in stored),
                                     rel=1e-12), windows)
    with pytest.raises(InvalidInput, match="keeps no KV cache"):
        _bits_at_context(_FP32_SCALES, 64, geometry, {**config, "num_kv_shared_layers": 4})


def test_validate_reads_the_model_geometry_once(monkeypatch):
    """It read it for the geometry check, and again for the bits."""
    from oscar_zoo.calibrate import validate as validate_module

    reads = []
    read = validate_module.model_geometry
    monkeypatch.setattr(validate_module, "model_geometry", lambda model: reads.append(1) or read(model))
    with pytest.raises(InvalidInput, match="validation data"):       # past the bits: too little text
        validate(_bundle(), _stand_in_model(), lambda text, **kw: {"input_ids": [1, 2, 3]},
                 ValidationConfig(context_len=512), quantizer=None)
    assert reads == [1]


# --- on the test model -------------------------------------------------------------------------

SINK, RECENT, T = 8, 16, 96


@pytest.mark.model
@pytest.mark.parametrize("baselines, missing", [(("oscar-shipped",), "hadamard and naive"),
                                                (("naive",), "hadamard")])
def test_a_bundle_never_passes_on_a_comparison_that_was_not_made(truncated_model, baselines, missing):
    """Without the Hadamard or naive baseline, its bound was +inf: every bundle passed, under
    a criterion that named the comparisons."""
    model, tok = truncated_model(2)
    report = validate(_bundle(2, SINK, RECENT), model, tok,
                      ValidationConfig(context_len=T, windows=1, baselines=baselines), kernel_quantizer())
    assert not report.passed
    assert f"not judged: the {missing} baseline was not run" in report.criterion


@pytest.mark.model
def test_per_layer_clips_are_measured_also_as_engines_serve_them(truncated_model):
    """SGLang and vLLM take one K and one V clip ratio; the report measured only the per-layer
    clips oscar-zoo's kernels use, so the published number was not what an engine runs."""
    model, tok = truncated_model(2)
    b = _bundle(2, SINK, RECENT)
    b.manifest = b.manifest.model_copy(update={"clip": b.manifest.clip.model_copy(update={
        "granularity": "layer", "searched": True, "k_global": 0.96, "v_global": 0.92})})
    cfg = ValidationConfig(context_len=T, windows=1, baselines=("hadamard", "naive"))
    for lid in b.layers:            # per-layer clips equal to the pair: the same cache
        b.k[lid].clip[:], b.v[lid].clip[:] = 0.96, 0.92
    by = {r.name: r for r in validate(b, model, tok, cfg, kernel_quantizer()).variants}
    assert by["bundle-served"].delta_nll == pytest.approx(by["bundle"].delta_nll, abs=1e-9)
    b.k[0].clip[:] = 0.5            # one layer clipped hard: only the per-layer number sees it
    by = {r.name: r for r in validate(b, model, tok, cfg, kernel_quantizer()).variants}
    assert by["bundle-served"].attn_rel_error < by["bundle"].attn_rel_error


@pytest.mark.model
@pytest.mark.parametrize("where, says", [("q_proj", "layer 1: the model's own queries hold NaN or inf"),
                                         ("lm_head", "next-token log-probabilities hold NaN or inf")])
def test_a_model_whose_own_output_overflows_is_named(truncated_model, where, says):
    """Only K and V were checked: an inf in a query or past the last layer made the reference
    loss NaN, and the manifest refused the report with a raw ValidationError after the run."""
    model, tok = truncated_model(2)
    module = model.model.layers[1].self_attn.q_proj if where == "q_proj" else model.lm_head
    hook = module.register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.tensor([5], device=out.device), float("inf")))
    try:
        with pytest.raises(InvalidInput, match=says):
            validate(_bundle(2, SINK, RECENT), model, tok,
                     ValidationConfig(context_len=T, windows=1, baselines=("naive",)), kernel_quantizer())
    finally:
        hook.remove()


def _attention_f64(q, k, v, k2, v2, scaling):
    """Per query i, one at a time: key j from BF16 when j < SINK or i - j < RECENT, causal."""
    _, hq, t, d = q.shape
    g = hq // k.shape[1]
    out = torch.zeros(1, t, hq, d, dtype=torch.float64)
    for i in range(t):
        j = torch.arange(i + 1)
        fp = ((j < SINK) | (i - j < RECENT))[:, None]
        for h in range(hq):
            kk = torch.where(fp, k[0, h // g, :i + 1].double(), k2[:i + 1, h // g])
            vv = torch.where(fp, v[0, h // g, :i + 1].double(), v2[:i + 1, h // g])
            out[0, i, h] = torch.softmax(kk @ q[0, h, i].double() * scaling, 0) @ vv
    return out


@pytest.fixture
def float32_model(truncated_model):
    """The test model's first 2 layers in float32 until the test ends. A GPU loads it in bf16
    (calibrate.loading), which rounds every attention output to 8 bits of mantissa before the next
    layer, the kernels' and a reference's differently: the KL would agree to ~5%, not 0.1%.
    (bf16 -> float32 -> bf16 is exact, so the session's model comes back as it was. transformers
    refuses .float() on a model loaded from GGUF, whose weights are plain tensors by then: the
    module's own cast.)"""
    model, tok = truncated_model(2)
    dtype = model.dtype
    torch.nn.Module.to(model, torch.float32)
    yield model, tok
    torch.nn.Module.to(model, dtype)


@pytest.mark.model
def test_validation_matches_a_float64_reference(float32_model):
    """Per-KV-head rotations, key centering, per-head clips (one head unclipped), 2 groups per
    row: extra loss, KL and per-layer attention error, against the same INT2 cache done in
    float64 one query at a time."""
    model, tok = float32_model
    bundle = _bundle(2, SINK, RECENT, group=32, per_head=True, centered=True)
    g = torch.Generator().manual_seed(7)
    for lid in bundle.layers:
        bundle.k[lid].clip[:] = [0.9, 0.75, 0.0]
        bundle.v[lid].clip[:] = (0.7 + 0.3 * torch.rand(3, generator=g)).numpy()
    cfg = ValidationConfig(context_len=T, windows=1, baselines=("naive",))
    report = validate(bundle, model, tok, cfg, kernel_quantizer())
    _, (window,) = eval_windows(tok, load_text(cfg.data, "heldout"), T, 1)

    eye = torch.eye(64)
    sides = {"bundle": lambda lid: [(torch.from_numpy(s[lid].rotation), torch.from_numpy(s[lid].clip),
                                     None if s[lid].mean is None else torch.from_numpy(s[lid].mean))
                                    for s in (bundle.k, bundle.v)],
             "naive": lambda lid: [(eye, torch.zeros(3), None)] * 2}

    def int2(name, lid, k, v):
        (rk, ck, mk), (rv, cv, _) = sides[name](lid)
        return (int2_f64(k[0].transpose(0, 1), rk, ck, 32, mk),
                int2_f64(v[0].transpose(0, 1), rv, cv, 32, None))

    errors = {}

    def measure(module, q, k, v, mask, kw):     # teacher-forced, on positions past the windows
        q, k, v = q.cpu(), k.cpu(), v.cpu()     # the reference runs on the CPU, the model anywhere
        exact = _attention_f64(q, k, v, k[0].transpose(0, 1).double(), v[0].transpose(0, 1).double(),
                               kw["scaling"])[:, SINK + RECENT:]
        for name in sides:
            o = _attention_f64(q, k, v, *int2(name, module.layer_idx, k, v), kw["scaling"])[:, SINK + RECENT:]
            errors[name, module.layer_idx] = float(((o - exact) ** 2).sum() / (exact ** 2).sum()) ** 0.5

    ids = torch.tensor([window], device=model.device)
    targets = ids[0, 1:, None]
    with torch.no_grad():
        with capture.observing(measure):
            ref = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        by = {v.name: v for v in report.variants}
        for name in sides:
            def replace(module, q, k, v, mask, kw, name=name):
                dev, (q, k, v) = q.device, (q.cpu(), k.cpu(), v.cpu())
                return _attention_f64(q, k, v, *int2(name, module.layer_idx, k, v), kw["scaling"]).to(dev, q.dtype)
            with capture.observing(replace):
                lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
            delta = float(ref.gather(1, targets).mean() - lp.gather(1, targets).mean())
            kl = float((ref.exp() * (ref - lp)).sum(-1).mean())
            assert by[name].delta_nll == pytest.approx(delta, rel=1e-3, abs=1e-5), name
            assert by[name].kl == pytest.approx(kl, rel=1e-3, abs=1e-6), name
            assert by[name].per_layer_attn_rel_error == pytest.approx(
                [errors[name, 0], errors[name, 1]], rel=1e-4), name
            assert by[name].attn_rel_error == pytest.approx((errors[name, 0] + errors[name, 1]) / 2, rel=1e-4)
    assert report.eval_tokens == T - 1
    # fp32 scale and zero per group of 32: 2 + 64/32 bits; 24 of 96 tokens stay BF16
    assert report.bits_int2_tier == 4.0
    assert report.bits_at_context == pytest.approx(4.0 * 72 / 96 + 16 * 24 / 96)


@pytest.mark.model
def test_a_lloyd_max_bundle_is_validated_with_lloyd_max_buckets(truncated_model):
    """SGLANG_LLOYD_MAX=1 models (minimax-m2.7, qwen3.5-35b-a3b) were validated with uniform
    buckets: the report measured a cache the engine does not hold."""
    model, tok = truncated_model(2)
    b = _bundle(2, SINK, RECENT, group=64)
    cfg = ValidationConfig(context_len=T, windows=1, baselines=("naive",))
    uniform = validate(b, model, tok, cfg, bundle_quantizer(b.manifest, "cpu"))
    lloyd = validate(_lloyd_max(b), model, tok, cfg, bundle_quantizer(b.manifest, "cpu"))
    assert (uniform.quantizer, lloyd.quantizer) == ("uniform", "lloyd_max")
    assert lloyd.int2_backend == "lloyd-max torch" and uniform.int2_backend == "vectorized"
    ours, theirs = lloyd.variants[0], uniform.variants[0]
    assert ours.name == theirs.name == "bundle"
    assert ours.delta_nll != theirs.delta_nll and ours.attn_rel_error != theirs.attn_rel_error



@pytest.mark.model
def test_progress_starts_at_zero_with_the_total_it_ends_at(truncated_model):
    """The job runner announced windows x (2 + baselines) steps: a searched bundle's served-clip
    variant made validation run more, so the bar's total jumped mid-run (30 to 36 by default)."""
    model, tok = truncated_model(2)
    b = _bundle(2, SINK, RECENT)
    b.manifest = b.manifest.model_copy(update={"clip": b.manifest.clip.model_copy(update={
        "granularity": "layer", "searched": True, "k_global": 0.96, "v_global": 0.92})})
    events = []
    validate(b, model, tok, ValidationConfig(context_len=T, windows=1, baselines=("hadamard", "naive")),
             kernel_quantizer(), progress=lambda **e: events.append(e))
    assert (events[0]["done"], events[-1]["done"]) == (0, 5)      # bf16, bundle, served, 2 baselines
    assert {e["total"] for e in events} == {5} and {e["phase"] for e in events} == {"validating"}


def test_too_little_held_out_text_names_the_flags_that_fix_it(tmp_path):
    """The message named only job-spec fields (validation.windows) to a CLI user."""
    (tmp_path / "tiny.txt").write_text("a few words")
    tok = lambda text, add_special_tokens=False: {"input_ids": list(range(len(text)))}  # noqa: E731
    with pytest.raises(InvalidInput, match=r"tiny.txt has 11 tokens, 2 x 64 needed: lower --windows "
                                           r"or --context-len \(validation.windows"):
        eval_windows(tok, load_text([str(tmp_path / "tiny.txt")], "heldout"), 64, 2)
