"""The clip search's Readers hold only the query rows the search reads, and search exactly as the
whole queries did: attention outputs, error curves and chosen clips equal bit for bit to
mixed_attention over full q [B, Hq, T, d] and mask [B|1, 1, T, T] indexed by `rows` (which
tests/calibrate/test_int2_attention.py checks against a float64 reference)."""

from __future__ import annotations

import pytest
import torch

from oscar_zoo.calibrate import clip_search
from oscar_zoo.calibrate.int2_attention import kernel_quantizer, mixed_attention, row_attention

B, HQ, H, T, D = 2, 4, 2, 40, 64      # head_dim 64: the kernels' least
SINK, RECENT, GROUP = 3, 6, 32


def _mask(kind: str) -> torch.Tensor:
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if kind == "causal":
        return (j <= i)[None, None]
    if kind == "sliding":
        return ((j <= i) & (i - j < 12))[None, None]
    if kind == "per-batch":      # [B, 1, T, T]: the second window left-padded by 5 tokens
        return torch.stack([j <= i, (j <= i) & (j >= 5)])[:, None]
    # a span attended bidirectionally (as Gemma 3's image tokens): searched rows in it read
    # later keys, so no block may stop at its last row
    assert kind == "span"
    return ((j <= i) | ((i >= 20) & (i < 30) & (j >= 20) & (j < 30)))[None, None]


def _data(dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, T, D, generator=g).to(dtype) for n in (HQ, H, H))
    k2 = (k.float() + 0.3 * torch.randn(k.shape, generator=g)).to(dtype)
    v2 = (v.float() + 0.3 * torch.randn(v.shape, generator=g)).to(dtype)
    return q, k, v, k2, v2


def _same(got, want):
    # bit for bit; NaN where the padding leaves a query no key, in both
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _rows(n: int = 16) -> torch.Tensor:
    return clip_search.query_rows(T, SINK, RECENT, n, seed=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind", ["causal", "sliding", "per-batch", "span"])
def test_row_attention_is_the_whole_query_attention_bit_for_bit(kind, dtype):
    q, k, v, k2, v2 = _data(dtype)
    allowed, rows = _mask(kind), _rows()
    reader = clip_search.Reader.of(None, q, allowed, 0.35, rows)
    for k_i, v_i in ((k2, v2), (k2, v), (k, v)):         # INT2 K and V, K alone, the reference
        for block in (5, 512):                           # several blocks, and one
            want = mixed_attention(q, k, v, allowed, 0.35, k_i, v_i, SINK, RECENT, rows, block)
            got = row_attention(reader.q, k, v, reader.allowed, 0.35, k_i, v_i, SINK, RECENT,
                                reader.rows, reader.causal, block)
            _same(got, want)


def test_a_reader_holds_only_the_searched_rows():
    q, *_ = _data(torch.bfloat16)
    allowed, rows = _mask("per-batch"), _rows(16)
    reader = clip_search.Reader.of(None, q, allowed, 0.35, rows)
    assert reader.q.shape == (B, HQ, 16, D)
    assert reader.allowed.shape == (B, 1, 16, T)        # every key column: rows read up to T keys
    assert torch.equal(reader.q, q[:, :, rows]) and torch.equal(reader.allowed, allowed[:, :, rows])
    for held in (reader.q, reader.allowed):             # copies, not views keeping the whole alive
        assert held.untyped_storage().nbytes() == held.numel() * held.element_size()
    assert reader.causal
    assert not clip_search.Reader.of(None, q, _mask("span"), 0.35, rows).causal


class _Attention(torch.nn.Module):
    """What the search reads of an attention module: its o_proj."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.o_proj = torch.nn.Linear(HQ * D, 96, bias=False).to(torch.bfloat16)


def _whole_query_error(whole: dict):
    """clip_search._relative_error as it was: over each reader's whole q and mask (whole[id])."""
    def relative_error(reader, k, v, sink, recent):
        q, allowed = whole[id(reader)]
        out_proj = clip_search._output_projection(reader.module, q.shape)

        def attention(k_i, v_i):
            return out_proj(mixed_attention(q, k, v, allowed, reader.scaling, k_i, v_i,
                                            sink, recent, reader.rows)).float()

        ref = attention(k, v)
        scale = float((ref ** 2).sum().clamp_min(1e-30))
        return lambda k_i, v_i: float(((attention(k_i, v_i) - ref) ** 2).sum()) / scale
    return relative_error


@pytest.mark.parametrize("per_head", [False, True])
def test_a_shared_caches_search_chooses_and_scores_as_over_whole_queries(per_head, monkeypatch):
    """A cache read by three layers, each with its own queries, o_proj and mask, searched from
    the Readers' rows and from the whole queries: the same curves and clips, bit for bit."""
    _, k, v, _, _ = _data(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    rot_k, rot_v = (torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))[0].float()
                    for _ in range(2))
    mean = 0.1 * torch.randn(H, D, generator=g)
    rows, whole, readers = _rows(), {}, []
    for i, kind in enumerate(["sliding", "causal", "span"]):
        q_i = _data(torch.bfloat16, seed=10 + i)[0]
        readers.append(clip_search.Reader.of(_Attention(i), q_i, _mask(kind), 0.125, rows))
        whole[id(readers[-1])] = (q_i, _mask(kind))

    @torch.no_grad()        # as inside the pipeline's forward
    def search():
        return clip_search.search_cache(readers, k, v, rot_k, rot_v, mean, GROUP, SINK, RECENT,
                                        kernel_quantizer(device="cpu"), per_head)

    got = search()
    monkeypatch.setattr(clip_search, "_relative_error", _whole_query_error(whole))
    want = search()
    assert len(set(got.k_curve)) > 1 and len(set(got.v_curve)) > 1      # a real choice was made
    assert got.k_curve == want.k_curve and got.v_curve == want.v_curve
    assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v)


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_the_pipeline_keeps_only_the_searched_rows_of_a_shared_caches_readers(family, monkeypatch):
    """What _clips holds until a shared cache's last reader has attended: each Reader's
    queries and mask at the clip_queries searched rows, not at every position of the window."""
    pytest.importorskip("transformers")
    from oscar_zoo.calibrate import pipeline
    from oscar_zoo.calibrate.loading import model_geometry

    from .test_kv_shared import _model
    from .test_kv_shared_calibration import _cfg, _windows

    model, cfg = _model(family), _cfg()
    geometry = model_geometry(model)
    fitted = {}
    for lid in geometry.layers():
        eye = torch.eye(geometry.head_dim_of(lid))
        fitted[lid] = pipeline.FittedLayer(eye, torch.ones(len(eye)), eye, torch.ones(len(eye)), None)
    held, search = [], clip_search.search_cache

    def spy(readers, *args, **kw):
        held.append([(tuple(r.q.shape), tuple(r.allowed.shape)) for r in readers])
        return search(readers, *args, **kw)

    monkeypatch.setattr(clip_search, "search_cache", spy)
    pipeline._clips(model, _windows(cfg)[1], cfg, geometry, fitted, pipeline._noop)
    # layer 0 alone, layer 2's cache with its reader 5, layer 1's with its readers 3 and 4
    assert sorted(len(group) for group in held) == [1, 2, 3]
    for group in held:
        for q_shape, mask_shape in group:
            assert q_shape[2] == cfg.clip_queries < cfg.seq_len
            assert mask_shape[-2:] == (cfg.clip_queries, cfg.seq_len)
