"""Lloyd-Max INT2 (SGLANG_LLOYD_MAX=1, oscar-spec 5) carried from the catalog through a
calibration: the job spec, the clip search's quantizer, the manifest, and validation's quantizer.

The catalog said OSCAR serves MiniMax-M2.7 and Qwen3.5-35B-A3B with Lloyd-Max buckets, yet a
calibration of them never recorded it, and its clip search and validation simulated uniform
INT2 only. No model is loaded or run here: the quantizer factories are replaced by recorders.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from oscar_zoo.calibrate import int2_attention, jobspec, loading, pipeline, runner
from oscar_zoo.calibrate import validate as validate_mod
from oscar_zoo.calibrate.pipeline import CalibrationConfig
from oscar_zoo.zoo import bundle as bundle_mod
from oscar_zoo.zoo import catalog
from oscar_zoo.zoo.errors import InvalidInput
from tests.utils.bundles import make_bundle


class Stop(Exception):
    pass


def _completed(body: dict) -> jobspec.JobSpec:
    spec = jobspec.parse_spec(body)
    return jobspec.complete(spec, jobspec.identity(spec)[2])


# --- the job spec ------------------------------------------------------------------------------

@pytest.mark.parametrize("model, lloyd", [("minimax-m2.7", True), ("qwen3.5-35b-a3b", True),
                                          ("smollm2-135m", False), ("qwen3-8b", False),
                                          ("someorg/some-model", False)])   # a hub id: no entry
def test_a_spec_gets_lloyd_max_from_the_catalog(model, lloyd):
    assert _completed({"model": model}).lloyd_max is lloyd


def test_the_int2_defaults_carry_lloyd_max():
    assert jobspec.int2_defaults(catalog.find("minimax-m2.7"))["lloyd_max"] is True
    assert jobspec.int2_defaults(catalog.find("smollm2-135m"))["lloyd_max"] is False
    assert jobspec.int2_defaults(None)["lloyd_max"] is False


def test_a_spec_that_says_lloyd_max_keeps_it():
    assert _completed({"model": "minimax-m2.7", "lloyd_max": False}).lloyd_max is False
    assert _completed({"model": "smollm2-135m", "lloyd_max": True}).lloyd_max is True


@pytest.mark.parametrize("body, says", [
    # the catalog turns it on for Qwen3.5-35B-A3B (head_dim 256): a group of 128 would be served
    # by SGLang's grouped kernel, which ignores SGLANG_LLOYD_MAX
    ({"model": "qwen3.5-35b-a3b", "group_size": 128}, "group_size 128 is below head_dim 256"),
    ({"model": "smollm2-135m", "group_size": 32, "lloyd_max": True}, "group_size 32 is below head_dim 64"),
])
def test_lloyd_max_with_a_group_below_head_dim_is_refused_at_submit(body, says):
    spec = _completed(body)
    with pytest.raises(InvalidInput, match="lloyd_max needs group_size == head_dim") as e:
        jobspec.check(spec, jobspec.identity(spec)[2].geometry)
    assert says in str(e.value) and "single-scale kernel" in str(e.value)
    assert "lloyd_max false" in str(e.value)      # the way out
    # in the words of a job spec: `oscar-zoo jobs submit` has no --uniform (review)
    assert '"lloyd_max": false in a job spec' in str(e.value)


@pytest.mark.parametrize("body", [
    {"model": "qwen3.5-35b-a3b"},                                       # the catalog's group: 256
    {"model": "qwen3.5-35b-a3b", "group_size": 128, "lloyd_max": False},   # uniform: any group
    {"model": "smollm2-135m", "group_size": 64, "lloyd_max": True},
])
def test_lloyd_max_with_one_scale_per_row_and_uniform_with_groups_are_accepted(body):
    spec = _completed(body)
    assert spec.lloyd_max is body.get("lloyd_max", True)
    jobspec.check(spec, jobspec.identity(spec)[2].geometry)


def test_lloyd_max_cannot_fit_mixed_head_dims():
    geometry = catalog.find("gemma-4-12b").geometry          # head_dim 256, 512 on full layers
    with pytest.raises(InvalidInput, match="no single group size fits head_dims 256, 512"):
        jobspec.check_int2_geometry(256, geometry, lloyd_max=True)
    jobspec.check_int2_geometry(256, geometry)                # uniform: fine


# --- the runner --------------------------------------------------------------------------------

@pytest.mark.parametrize("lloyd", [True, False])
def test_calibration_config_copies_lloyd_max(lloyd):
    spec = _completed({"model": "smollm2-135m", "lloyd_max": lloyd})
    assert runner.calibration_config(spec).lloyd_max is lloyd


def test_a_spec_stored_before_lloyd_max_existed_calibrates_uniform():
    spec = jobspec.parse_spec({"model": "minimax-m2.7", "sink_tokens": 128, "recent_tokens": 1024})
    assert spec.lloyd_max is None and runner.calibration_config(spec).lloyd_max is False


def test_the_runner_validates_with_the_bundles_own_quantizer(monkeypatch, tmp_path):
    """It validated with kernel_quantizer(scale dtype) whatever the bundle said: uniform INT2
    for a Lloyd-Max bundle. Here bundle_quantizer is replaced by a recorder of its call, and
    the load, calibration and validation by stand-ins."""
    made = bundle_mod.read(make_bundle(tmp_path / "made", model="smollm2-135m").path)
    made.manifest = made.manifest.model_copy(update={"quantization": made.manifest.quantization
                                                     .model_copy(update={"lloyd_max": True})})
    calls = []
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    monkeypatch.setattr(validate_mod, "eval_windows", lambda *a, **k: ["held out"])
    monkeypatch.setattr(pipeline, "calibrate", lambda cfg, progress=None, loaded=None, text=None: (
        calls.append(("calibrate", cfg.lloyd_max))
        or SimpleNamespace(bundle=made, timings={}, tokens_per_pass=1)))

    def bundle_quantizer(manifest, device=None):
        calls.append(("bundle_quantizer", manifest.quantization.lloyd_max, device))
        return "the bundle's quantizer"

    def kernel_quantizer(*args, **kwargs):
        raise AssertionError("validation built its quantizer without the bundle's manifest")

    def validate(bundle, model, tok, cfg, quantizer, progress=None, held_out=None):
        calls.append(("validate", quantizer))
        raise Stop

    monkeypatch.setattr(int2_attention, "bundle_quantizer", bundle_quantizer, raising=False)
    monkeypatch.setattr(int2_attention, "kernel_quantizer", kernel_quantizer)
    monkeypatch.setattr(validate_mod, "validate", validate)
    spec = _completed({"model": "smollm2-135m", "lloyd_max": True}).model_dump(mode="json")
    with pytest.raises(Stop):
        runner.run({"id": "job-1", "spec": spec}, tmp_path / "out", lambda *a, **k: None,
                   lambda: False)
    assert calls == [("calibrate", True), ("bundle_quantizer", True, None),
                     ("validate", "the bundle's quantizer")]


# --- the pipeline ------------------------------------------------------------------------------

@pytest.mark.parametrize("lloyd", [True, False])
def test_the_clip_search_simulates_lloyd_max_when_the_config_says_so(monkeypatch, lloyd):
    """The clip search built kernel_quantizer(scale dtype, device): uniform INT2 always. Here
    kernel_quantizer is replaced by a recorder of its call, which stops the search."""
    seen = []

    def kernel_quantizer(scale_dtype=torch.float32, device=None, lloyd_max=False):
        seen.append((scale_dtype, device, lloyd_max))
        raise Stop

    monkeypatch.setattr(pipeline, "kernel_quantizer", kernel_quantizer)
    cfg = CalibrationConfig(model="smollm2-135m", scale_dtype="float16", lloyd_max=lloyd)
    geometry = catalog.find("smollm2-135m").geometry
    with pytest.raises(Stop):
        pipeline._clips(SimpleNamespace(device="cpu"), [], cfg, geometry, {}, pipeline._noop)
    assert seen == [(torch.float16, "cpu", lloyd)]


@pytest.mark.parametrize("lloyd", [True, False])
def test_the_manifest_records_lloyd_max(lloyd):
    geometry = catalog.find("smollm2-135m").geometry
    cfg = CalibrationConfig(model="smollm2-135m", clip_search=False, lloyd_max=lloyd, seq_len=512)
    d = geometry.head_dim
    eye = torch.eye(d)
    fitted = {lid: SimpleNamespace(rot_k=eye, rot_v=eye, eig_k=torch.ones(d), eig_v=torch.ones(d),
                                   mean=None) for lid in geometry.layers()}
    clips = pipeline._clips(None, [], cfg, geometry, fitted, pipeline._noop)   # fixed ratios
    model = SimpleNamespace(config=SimpleNamespace(architectures=["LlamaForCausalLM"]))
    src = SimpleNamespace(name="smollm2-135m", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct")
    text = SimpleNamespace(name="synthetic", sha256="0" * 64)
    bundle = pipeline._bundle(cfg, src, model, geometry, text, [[0] * 512], fitted, clips)
    assert bundle.manifest.quantization.lloyd_max is lloyd
    assert bundle.manifest.quantization.group_size == d        # one scale per row


def test_calibrate_refuses_lloyd_max_with_groups_before_the_passes(monkeypatch):
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=128)
    model = transformers.LlamaForCausalLM(config)

    def never(*a, **k):
        raise AssertionError("a pass ran before the group size was checked")

    monkeypatch.setattr(pipeline, "_pass", never)
    monkeypatch.setattr(pipeline, "load_text", never)
    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, group_size=64, lloyd_max=True)
    with pytest.raises(InvalidInput, match="lloyd_max needs group_size == head_dim"):
        pipeline.calibrate(cfg, loaded=(model, None))


# --- bundle_quantizer: Lloyd-Max exactly where SGLang applies it (review) -----------------------

def _lm_manifest(group_size=128, head_dim=128, by_layer=None, k=0.96, v=0.92, lloyd=True):
    return SimpleNamespace(
        quantization=SimpleNamespace(lloyd_max=lloyd, group_size=group_size, scale_dtype="float32"),
        geometry=SimpleNamespace(head_dim=head_dim, head_dim_by_layer=by_layer or {}),
        clip=SimpleNamespace(k_global=k, v_global=v))


def _is_lloyd(q, d, group_size):
    from oscar_zoo import kernels

    x = torch.randn(16, 2, d, generator=torch.Generator().manual_seed(d))
    got = q(x, None, torch.tensor([0.9, 0.9]), group_size, None)
    return torch.equal(got, kernels.fake_quantize_kv_lloyd_max(x, None, torch.tensor([0.9, 0.9]), None))


def test_bundle_quantizer_is_uniform_when_both_clip_ratios_are_off():
    """oscar-spec 5: SGLang applies SGLANG_LLOYD_MAX=1 only in its clip kernel (K or V ratio > 0);
    with both ratios 0 it quantizes uniform, and validation must simulate that."""
    q = int2_attention.bundle_quantizer(_lm_manifest(k=0.0, v=0.0), "cpu")
    assert q.kind == "uniform" and not _is_lloyd(q, 128, 128)
    q = int2_attention.bundle_quantizer(_lm_manifest(k=0.0, v=0.92), "cpu")
    assert q.kind == "lloyd_max" and _is_lloyd(q, 128, 128)


def test_bundle_quantizer_with_mixed_head_dims_buckets_the_single_scale_layers_only():
    """Group 256 on a model with 256- and 512-dim layers: SGLang's single-scale kernel (Lloyd-Max)
    serves the 256 layers, its grouped kernel (uniform) the 512 ones. The quantizer raised
    InvalidInput on the 512 layers."""
    q = int2_attention.bundle_quantizer(_lm_manifest(256, 256, {"5": 512}), "cpu")
    assert q.kind == "lloyd_max"
    assert _is_lloyd(q, 256, 256)
    assert not _is_lloyd(q, 512, 256)


def test_bundle_quantizer_is_uniform_with_groups_below_every_head_dim():
    q = int2_attention.bundle_quantizer(_lm_manifest(64, 128), "cpu")
    assert q.kind == "uniform" and not _is_lloyd(q, 128, 64)


def test_a_lloyd_max_spec_with_both_clips_off_is_refused_at_submit():
    spec = _completed({"model": "minimax-m2.7", "clip_search": False, "k_clip": 0, "v_clip": 0})
    assert spec.lloyd_max is True
    with pytest.raises(InvalidInput, match="clip kernel") as e:
        jobspec.check(spec, jobspec.identity(spec)[2].geometry)
    assert "lloyd_max false" in str(e.value)
    ok = _completed({"model": "minimax-m2.7", "clip_search": False, "k_clip": 0, "v_clip": 0.92})
    jobspec.check(ok, jobspec.identity(ok)[2].geometry)
    uniform = _completed({"model": "minimax-m2.7", "clip_search": False, "k_clip": 0, "v_clip": 0,
                          "lloyd_max": False})
    jobspec.check(uniform, jobspec.identity(uniform)[2].geometry)
