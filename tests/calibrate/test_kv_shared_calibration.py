"""Calibration of KV-shared models (Gemma 3n, Gemma 4) on the tiny random text models of
test_kv_shared.py.

A shared layer stores no K/V: it reads its source layer's cache, which an engine stores once,
in the source's basis and with the source's clips. So the source's rotations must serve every
reader's queries, its clips every reader's attention output, and the bundle must give each
shared layer the source's tensors. The statistics are checked against float64 numpy on the
captured Q/K/V (tests/calibrate/reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate import capture, clip_search, pipeline
from oscar_zoo.calibrate.data import load_text, token_windows
from oscar_zoo.calibrate.int2_attention import kernel_quantizer
from oscar_zoo.calibrate.loading import model_geometry
from oscar_zoo.calibrate.moments import LayerMoments
from oscar_zoo.calibrate.pipeline import CalibrationConfig, FittedLayer, calibrate, forward

from . import reference as ref
from .test_kv_shared import GROUP, MODELS, RECENT, SINK, T, _model, _sources, _validate

transformers = pytest.importorskip("transformers")

LAYERS = list(range(6))


class _CharTokenizer:
    """One token per character, inside the tiny models' vocabulary of 128."""

    add_bos_token = False
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 128 for c in text]}


def _cfg(**kw) -> CalibrationConfig:
    # 2 calibration windows of T tokens, 1 held out for the clip search
    base = dict(model="someorg/tiny-gemma", tokens=2 * T, seq_len=T, sink_tokens=SINK,
                recent_tokens=RECENT, group_size=GROUP, clip_windows=1, clip_queries=16)
    return CalibrationConfig(**{**base, **kw})


def _windows(cfg):
    """(calibration, held-out) windows exactly as calibrate() cuts them."""
    n_clip = cfg.clip_windows if cfg.clip_search else 0
    w = token_windows(_CharTokenizer(), load_text(cfg.data), cfg.seq_len,
                      cfg.tokens + n_clip * cfg.seq_len, cfg.seed, held_out=n_clip)
    return w[:len(w) - n_clip], w[len(w) - n_clip:]


def _captured(model, windows) -> dict[int, list[tuple]]:
    """Per layer, (q, k, v) of every window, one forward per window as calibrate() on a CPU."""
    raw: dict[int, list[tuple]] = {}
    with capture.observing(lambda m, q, k, v, mask, kw: raw.setdefault(m.layer_idx, []).append((q, k, v))):
        for w in windows:
            forward(model, [w])
    return raw


def _rows(x: torch.Tensor) -> np.ndarray:
    # [B, H, T, d] -> [B*T, H, d] float64
    return x.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]).double().numpy()


# --- the forward the passes run --------------------------------------------------------------

def _llama():
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    capture.install(model)
    return model


@pytest.mark.parametrize("family", [*MODELS, "llama"])
def test_the_passes_see_every_query_position_and_only_the_last_logits(family):
    """forward() asked for logits_to_keep=1, which Gemma 4 reads as leave to run its KV-shared
    layers on the last position alone: their queries were [B, Hq, 1, d], pass 1 counted one row
    per window and the clip search failed with an IndexError. Every layer must see all T
    positions, and the logits stay one position (a 262K vocabulary over every position would
    cost GBs a window)."""
    model = _llama() if family == "llama" else _model(family)
    windows = [list(range(T)), list(range(T, 0, -1))]
    seen = {}
    with capture.observing(lambda m, q, k, v, mask, kw: seen.setdefault(m.layer_idx, q.shape)):
        logits = forward(model, windows).logits
    assert sorted(seen) == list(range(model.config.num_hidden_layers))
    assert all(shape[2] == T for shape in seen.values()), seen
    assert logits.shape == (2, 1, 128)
    with torch.no_grad():
        full = model(input_ids=torch.tensor(windows), use_cache=False).logits
    torch.testing.assert_close(logits, full[:, -1:], rtol=1e-5, atol=1e-6)


# --- the moments -----------------------------------------------------------------------------

def test_a_readers_queries_pool_into_its_sources_query_moment():
    g = torch.Generator().manual_seed(0)
    q_src, q_reader = torch.randn(2, 4, 10, 8, generator=g), torch.randn(1, 4, 7, 8, generator=g)
    k = torch.randn(2, 2, 10, 8, generator=g)
    source, reader = LayerMoments(2, 8), LayerMoments(2, 8)
    source.update_pass1(q_src, k, k)
    reader.update_pass1(q_reader, k[:1, :, :7], k[:1, :, :7])
    source.add_queries(reader)
    pooled = np.concatenate([_rows(q_src), _rows(q_reader)])                 # [27, Hq, d]
    np.testing.assert_allclose(source.q_cov().numpy(), ref.qqt(pooled, 2), rtol=1e-12)
    np.testing.assert_allclose(source.k_mean().numpy(), _rows(k).mean(0), rtol=1e-12)  # its own keys
    source.update_pass2(k, k)
    with pytest.raises(RuntimeError, match="stale"):
        source.add_queries(reader)


# --- end to end --------------------------------------------------------------------------------

def _check_eigenpairs(side, cov: np.ndarray) -> None:
    """The bundle side's eigenvalues are cov's, and its rotation's eigenvector columns U
    (R = U H P) satisfy cov U = U diag(eig): signs and near-degenerate pairs need no matching."""
    eig_ref = np.linalg.eigvalsh(cov)
    np.testing.assert_allclose(side.eigenvalues, eig_ref, rtol=1e-4, atol=1e-6 * eig_ref.max())
    u = ref.eigenvectors(side.rotation, eig_ref)
    residual = cov @ u - u * eig_ref[None, :]
    assert np.abs(residual).max() < 1e-4 * eig_ref.max()


@pytest.mark.parametrize("family", list(MODELS))
def test_calibrating_a_kv_shared_model_fits_each_cache_to_all_its_readers(family):
    model = _model(family)
    cfg = _cfg()
    events = []
    bundle = calibrate(cfg, progress=lambda **e: events.append(e), loaded=(model, _CharTokenizer())).bundle
    sources = _sources(model)
    assert bundle.layers == LAYERS
    for shared, source in sources.items():     # the one cache an engine stores, in its basis
        for side in ("k", "v"):
            got, want = bundle.side(side)[shared], bundle.side(side)[source]
            for name in ("rotation", "eigenvalues", "clip", "mean"):
                a, b = getattr(got, name), getattr(want, name)
                assert (a is None and b is None) or np.array_equal(a, b), (shared, side, name)
    # pass 2 runs over the storing layers only: the shared ones' queries are in C already
    assert {e["layer"] for e in events if e["phase"] == "pass2"} == {0, 1, 2}
    assert {e["layer"] for e in events if e["phase"] == "pass1"} == set(LAYERS)

    calib, _ = _windows(cfg)
    raw = _captured(model, calib)
    readers = {src: [lid for lid, s in sources.items() if s == src] for src in set(sources.values())}
    for lid in (0, 1, 2):
        own_q = np.concatenate([_rows(t[0]) for t in raw[lid]])
        q = np.concatenate([_rows(t[0]) for member in [lid, *readers.get(lid, [])] for t in raw[member]])
        k = np.concatenate([_rows(t[1]) for t in raw[lid]])
        v = np.concatenate([_rows(t[2]) for t in raw[lid]])
        assert q.shape[0] == (1 + len(readers.get(lid, []))) * 2 * T      # every position counted
        k_cov, v_cov = ref.qqt(q, 2).mean(0), ref.sst(q, k, v).mean(0)
        _check_eigenpairs(bundle.k[lid], k_cov)
        _check_eigenpairs(bundle.v[lid], v_cov)
        np.testing.assert_allclose(bundle.k[lid].mean, k.mean(0), rtol=1e-5, atol=1e-6)
        if lid in readers:      # the test can tell: the source's queries alone give other statistics
            own_eig = np.linalg.eigvalsh(ref.qqt(own_q, 2).mean(0))
            assert not np.allclose(bundle.k[lid].eigenvalues, own_eig, rtol=1e-2)
            own_v = np.linalg.eigvalsh(ref.sst(own_q, k, v).mean(0))
            assert not np.allclose(bundle.v[lid].eigenvalues, own_v, rtol=1e-2)

    report = _validate(model, bundle)       # validation reads it as engines store it
    assert [v.name for v in report.variants] == ["bundle", "bundle-served"]   # searched clips
    for variant in report.variants:
        assert len(variant.per_layer_attn_rel_error) == 6
        assert all(np.isfinite([variant.delta_nll, variant.kl, *variant.per_layer_attn_rel_error]))


@pytest.mark.parametrize("family", list(MODELS))
def test_a_shared_caches_clips_are_searched_against_the_error_of_all_its_readers(family):
    """The source's error curves are the sums of its own and its readers' (each searched alone
    with the same rotations), its clips that sum's minimum, and every reader gets them."""
    model = _model(family)
    cfg = _cfg()
    geometry = model_geometry(model)
    g = torch.Generator().manual_seed(3)
    fitted = {}
    for lid in LAYERS:      # random orthogonal rotations and means, different per layer
        d = geometry.head_dim_of(lid)
        rot_k, rot_v = (torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0].float()
                        for _ in range(2))
        fitted[lid] = FittedLayer(rot_k, torch.ones(d), rot_v, torch.ones(d),
                                  0.1 * torch.randn(2, d, generator=g))
    _, held_out = _windows(cfg)
    clips = pipeline._clips(model, held_out, cfg, geometry, fitted, pipeline._noop)
    sources = _sources(model)
    assert sorted(clips) == LAYERS

    raw = {}
    with capture.observing(lambda m, q, k, v, mask, kw: raw.setdefault(m.layer_idx, (m, q, k, v, mask, kw))):
        forward(model, held_out)
    rows = clip_search.query_rows(T, SINK, RECENT, cfg.clip_queries, cfg.seed)

    @torch.no_grad()        # as inside the pipeline's forward
    def alone(lid, owner):
        m, q, k, v, mask, kw = raw[lid]
        f = fitted[owner]
        return clip_search.search_layer(m, q, k, v, capture.bool_mask(mask, T, T, q.device),
                                        kw["scaling"], f.rot_k, f.rot_v, f.mean, GROUP, SINK,
                                        RECENT, rows, kernel_quantizer(device="cpu"))

    for source in sorted(set(sources.values())):
        members = [source, *[lid for lid, s in sources.items() if s == source]]
        k_sum = np.sum([alone(lid, source).k_curve for lid in members], axis=0)
        np.testing.assert_allclose(clips[source].k_curve, k_sum, rtol=1e-6)
        assert float(clips[source].k[0]) == pytest.approx(clip_search.GRID[int(np.argmin(k_sum))])
        assert all(clips[lid] is clips[source] for lid in members)
    # a layer nobody else reads is searched on its own error, as before
    np.testing.assert_allclose(clips[0].k_curve, alone(0, 0).k_curve, rtol=1e-6)
    np.testing.assert_allclose(clips[0].v_curve, alone(0, 0).v_curve, rtol=1e-6)


def test_the_global_clip_pair_counts_each_stored_cache_once():
    """A shared layer holds its source's LayerClips, whose curves already sum every reader's
    error: counted once per layer instead, layer 1's cache would weigh three times over."""
    from types import SimpleNamespace

    from oscar_zoo.zoo.geometry import ModelGeometry

    geometry = ModelGeometry(3, 4, 2, 64)
    cfg = CalibrationConfig(model="someorg/tiny-gemma", seq_len=T, sink_tokens=SINK,
                            recent_tokens=RECENT, group_size=GROUP)
    n = len(clip_search.GRID)

    def clips(best: int, other: float) -> clip_search.LayerClips:
        # error 0 at GRID[best], `other` at the far end of the grid, 5 between
        curve = [0.0 if i == best else other if i in (0, n - 1) else 5.0 for i in range(n)]
        c = torch.full((2,), clip_search.GRID[best])
        return clip_search.LayerClips(c, c, curve, list(curve))

    # once each: GRID[0] costs 0 + 1, GRID[-1] 1.5 + 0; with layer 1's counted twice, 2 and 1.5
    own, shared = clips(0, 1.5), clips(n - 1, 1.0)
    eye = torch.eye(64)
    fitted = {lid: FittedLayer(eye, torch.ones(64), eye, torch.ones(64), None) for lid in range(3)}
    bundle = pipeline._bundle(cfg, SimpleNamespace(name="tiny", hub_id="someorg/tiny-gemma"),
                              SimpleNamespace(config=SimpleNamespace(architectures=None)), geometry,
                              SimpleNamespace(name="synthetic", sha256="0" * 64), [[0] * T], fitted,
                              {0: own, 1: shared, 2: shared})
    assert bundle.manifest.clip.k_global == bundle.manifest.clip.v_global == clip_search.GRID[0]
    assert np.array_equal(bundle.k[2].clip, bundle.k[1].clip)
