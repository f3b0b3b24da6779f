"""Calibration on the real test model: capture fidelity, the streaming fit against a direct
float64 computation on the same captured tensors, and a bundle that verifies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate import capture
from oscar_zoo.calibrate.data import load_text, token_windows
from oscar_zoo.calibrate.pipeline import CalibrationConfig, calibrate, forward
from oscar_zoo.zoo import bundle as B
from oscar_zoo.zoo.errors import InvalidInput

from . import reference as ref

pytestmark = pytest.mark.model


def test_capture_sees_exactly_what_the_cache_stores(smollm2):
    model, tok = smollm2
    ids = torch.tensor([tok("The capital of France is Paris. " * 8)["input_ids"]])
    seen = {}
    with capture.observing(lambda m, q, k, v, mask, kw: seen.setdefault(m.layer_idx, (q, k, v))):
        out = model(input_ids=ids, use_cache=True)
    assert sorted(seen) == list(range(30))
    for lid in (0, 17, 29):
        cache = out.past_key_values.layers[lid]
        assert torch.equal(seen[lid][1], cache.keys) and torch.equal(seen[lid][2], cache.values)
    assert seen[0][0].shape[1] == 9 and seen[0][1].shape[1] == 3      # 9 query heads, 3 KV heads
    with capture.observing(lambda *a: None):
        observed = model(input_ids=ids).logits
    assert torch.equal(observed, model(input_ids=ids).logits)          # observing changes nothing


def test_streaming_fit_equals_direct_float64_computation(truncated_model):
    model, tok = truncated_model(4)
    # 3 windows, 2 per forward: the V statistics are final only in the second, shorter forward,
    # and each layer's fit is started there, on a host thread.
    cfg = CalibrationConfig(model="smollm2-135m", tokens=1536, seq_len=512, batch_size=2,
                            clip_search=False, key_centering=True)
    result = calibrate(cfg, loaded=(model, tok))
    bundle = result.bundle
    assert bundle.layers == [0, 1, 2, 3] and result.tokens_per_pass == 1536

    # Capture the same windows' raw tensors and compute the formulas directly.
    windows = token_windows(tok, load_text(cfg.data), cfg.seq_len, cfg.tokens, cfg.seed)
    raw = {}
    with capture.observing(lambda m, q, k, v, mask, kw: raw.setdefault(m.layer_idx, []).append((q, k, v))):
        for w in windows:
            forward(model, [w])
    rows = lambda x: x.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]).double().numpy()  # noqa: E731
    for lid in range(4):
        q = np.concatenate([rows(t[0]) for t in raw[lid]])
        k = np.concatenate([rows(t[1]) for t in raw[lid]])
        v = np.concatenate([rows(t[2]) for t in raw[lid]])
        for side, cov in (("k", ref.qqt(q, 3).mean(0)), ("v", ref.sst(q, k, v).mean(0))):
            u_ref, eig_ref, _ = ref.oscar_rotation(cov)
            got = bundle.side(side)[lid]
            np.testing.assert_allclose(got.eigenvalues, eig_ref, rtol=1e-4, atol=1e-6 * eig_ref.max())
            # R = U H P; recover U and compare columns up to sign (eigh signs are arbitrary)
            u = ref.eigenvectors(got.rotation, eig_ref)
            top = np.argsort(eig_ref)[-8:]      # well-separated leading eigenvectors
            np.testing.assert_allclose(np.abs(np.sum(u * u_ref, 0))[top], 1.0, atol=1e-3)
        np.testing.assert_allclose(bundle.k[lid].mean, k.mean(0), rtol=1e-5, atol=1e-6)


def test_calibrated_bundle_writes_and_verifies(truncated_model, tmp_path):
    model, tok = truncated_model(2)
    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, seq_len=512, clip_search=False,
                            granularity="kv_head", k_objective="ktk", v_objective="vtv")
    events, after_last_layer = [], []
    hook = model.model.norm.register_forward_hook(lambda *a: after_last_layer.append(1))
    try:
        bundle = calibrate(cfg, progress=lambda **e: events.append(e), loaded=(model, tok)).bundle
    finally:
        hook.remove()
    assert not after_last_layer       # a pass stops once the last layer's Q/K/V are captured
    B.write(bundle, tmp_path / "b")
    m = B.verify_bundle(tmp_path / "b")
    assert m.method.granularity == "kv_head" and m.calibration.tokens == 512
    assert m.calibration.spec["k_objective"] == "ktk" and m.calibration.dataset_sha256
    assert bundle.k[0].rotation.shape == (3, 64, 64)
    phases = [e["phase"] for e in events]
    assert "pass1" in phases and "pass2" not in phases and "fitting" in phases  # vtv needs no pass 2
    assert "loading" not in phases    # the caller loaded the model and reported it: no step back to 0/1
    assert max(e["done"] for e in events if e["phase"] == "pass1") == 2        # 1 window x 2 layers


def test_a_hadamard_key_side_beside_a_fitted_value_side_exports_as_oscar_names_them(
        truncated_model, tmp_path):
    """The manifest held one composition for both sides, so K came out as the objective
    `hadamard_r_h_pbr`, which no engine script knows and which re-imports as unknown."""
    from oscar_zoo.zoo.interop.convert import export_files

    model, tok = truncated_model(1)
    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, seq_len=512, clip_search=False,
                            k_objective="hadamard", v_objective="sst")
    bundle = calibrate(cfg, loaded=(model, tok)).bundle
    m = bundle.manifest.method
    assert (m.composition_of("k"), m.composition_of("v")) == ("none", "r_h_pbr")
    k_path, v_path = export_files(bundle, tmp_path / "sglang")
    assert (k_path.name, v_path.name) == ("k_rotation_hadamard.pt", "v_rotation_sst_r_h_pbr.pt")
    prefix = "oscar2_" if m.key_centering else ""      # centered keys: OSCAR's format 3
    assert torch.load(k_path, weights_only=True)["objective"] == f"{prefix}hadamard"


def test_the_default_group_size_is_one_for_every_layer():
    """With head dims 64 and 256, layers of 256 were clip-searched with groups of 128 while the
    manifest (what validation and serving use) said 64, the first layer's."""
    from oscar_zoo.calibrate.pipeline import group_size
    from oscar_zoo.zoo.geometry import ModelGeometry

    mixed = ModelGeometry(4, 8, 2, 256, (), {0: 64})
    assert group_size(CalibrationConfig(model="m"), mixed) == 64
    assert group_size(CalibrationConfig(model="m", group_size=32), mixed) == 32
    assert group_size(CalibrationConfig(model="m"), ModelGeometry(4, 8, 2, 256)) == 128


def test_windows_per_forward_batches_on_a_gpu_only():
    from oscar_zoo.calibrate.pipeline import GPU_TOKENS, windows_per_forward

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    cfg = CalibrationConfig(model="smollm2-135m", seq_len=2048)
    assert windows_per_forward(cfg, cpu) == 1
    assert windows_per_forward(cfg, cuda) == GPU_TOKENS // 2048 > 1
    assert windows_per_forward(CalibrationConfig(model="m", seq_len=GPU_TOKENS * 2), cuda) == 1
    assert windows_per_forward(CalibrationConfig(model="m", batch_size=3), cuda) == 3
    assert windows_per_forward(CalibrationConfig(model="m", batch_size=3), cpu) == 3


def test_validation_with_one_window_reports_one_evaluation_set(truncated_model):
    # Windows alternate between sets A and B; with one window, set B holds no tokens and must
    # not be reported as a loss of exactly 0.
    from oscar_zoo.calibrate.int2_attention import kernel_quantizer
    from oscar_zoo.calibrate.validate import ValidationConfig, validate

    model, tok = truncated_model(2)
    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, seq_len=512, clip_search=False,
                            sink_tokens=16, recent_tokens=32)
    bundle = calibrate(cfg, loaded=(model, tok)).bundle
    report = validate(bundle, model, tok, ValidationConfig(context_len=128, windows=1,
                                                           baselines=("naive",)), kernel_quantizer())
    for v in report.variants:
        assert len(v.delta_nll_by_set) == 1, v
        assert v.delta_nll_by_set[0] == pytest.approx(v.delta_nll)
    assert report.eval_tokens == 127


def test_validation_names_a_layer_whose_own_keys_overflow(truncated_model):
    # The INT2 kernels leave a row holding inf or NaN unspecified, so such a model must be named,
    # not scored. A forward hook stands in for an overflowing model (none is available offline).
    from oscar_zoo.calibrate.int2_attention import kernel_quantizer
    from oscar_zoo.calibrate.validate import ValidationConfig, validate
    from oscar_zoo.zoo.errors import InvalidInput

    model, tok = truncated_model(2)
    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, seq_len=512, clip_search=False,
                            sink_tokens=16, recent_tokens=32)
    bundle = calibrate(cfg, loaded=(model, tok)).bundle
    hook = model.model.layers[1].self_attn.k_proj.register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.tensor([5]), float("inf")))
    try:
        with pytest.raises(InvalidInput, match="layer 1: the model's own keys or values hold NaN or inf"):
            validate(bundle, model, tok, ValidationConfig(context_len=128, windows=1,
                                                          baselines=("naive",)), kernel_quantizer())
    finally:
        hook.remove()


@pytest.mark.parametrize("overflow_in, says", [("calibration", "calibration text"),
                                               ("clip search", "held-out text")])
def test_a_model_that_overflows_is_named_not_fitted_on_nan(truncated_model, overflow_in, says):
    """One inf in one key of layer 1 (an fp16 overflow, say). In the calibration windows it
    reached the statistics and failed only at the write, as NaN in k.1.mean; in the clip
    search it made every error comparison false and picked the harshest clip, 0.62, for
    every layer, in a bundle that verified."""
    model, tok = truncated_model(2)
    forwards = []

    def overflow(module, args, out):
        forwards.append(1)
        if (overflow_in == "clip search") != (len(forwards) <= 2):   # passes 1 and 2 come first
            out = out.clone()
            out[0, 400, 5] = float("inf")
        return out

    cfg = CalibrationConfig(model="smollm2-135m", tokens=512, seq_len=512, clip_windows=1,
                            clip_queries=64, clip_search=True)
    hook = model.model.layers[1].self_attn.k_proj.register_forward_hook(overflow)
    try:
        with pytest.raises(InvalidInput, match=f"layer 1: .* NaN or inf on the {says}"):
            calibrate(cfg, loaded=(model, tok))
    finally:
        hook.remove()
    assert len(forwards) == (1 if overflow_in == "calibration" else 3)
