"""Model + text -> verified rotation bundle.

    load -> pass 1 (query/key moments) -> pass 2 (score-weighted V moments) -> fit
         -> clip search (held-out windows) -> bundle
Streaming: per-token tensors live only inside one layer's attention call; what persists is
O(layers x kv_heads x d^2). Nothing is written but the bundle, and that atomically.

KV-shared layers (Gemma 3n, Gemma 4: cache_bits.kv_sources) hold no cache of their own: they
read the K/V their source layer stored, as an engine stores it once, in the source's basis. So
the source's rotations are fitted to its own queries and its readers' pooled (moments.add_queries),
its clips searched against the error summed over all of them, and every reader carries the
source's tensors in the bundle, for engines that look them up by layer id.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from oscar_zoo.zoo import __version__
from oscar_zoo.zoo.bundle import Bundle, SideTensors
from oscar_zoo.zoo.errors import InvalidInput, UnsupportedModelError
from oscar_zoo.zoo.manifest import (Calibration, Clip, Geometry, Manifest, Method, ModelRef,
                                    Quantization, utc_now)

from . import capture, clip_search, fit, jobspec
from .cache_bits import kv_sources
from .data import BUILTIN, load_text, token_windows
from .int2_attention import kernel_quantizer
from .loading import load_model, loaded_revision, model_geometry, resolve_source
from .fitter import Fitter
from .moments import LayerMoments

Progress = Callable[..., None]   # progress(phase=..., done=..., total=..., layer=..., **info)


@dataclass
class CalibrationConfig:
    model: str
    revision: str | None = None
    data: list[str] = field(default_factory=lambda: [BUILTIN])
    text_field: str = "text"
    tokens: int = 30000
    seq_len: int = 2048
    batch_size: int | None = None     # windows per forward; None: 1 on a CPU, GPU_TOKENS' worth on a GPU
    seed: int = 0
    k_objective: str = "qqt"          # qqt | ktk | hadamard
    v_objective: str = "sst"          # sst | vtv | hadamard
    composition: str = "r_h_pbr"
    granularity: str = "layer"        # layer | kv_head
    key_centering: bool = True
    clip_search: bool = True
    clip_per_head: bool = False
    clip_windows: int = 2             # held-out windows for the clip search
    clip_queries: int = 256           # query positions per search
    k_clip: float = 0.96              # used when clip_search is off (OSCAR's shipped values)
    v_clip: float = 0.92
    group_size: int | None = None     # default: the catalog's, else min(128, head_dim)
    scale_dtype: str = "float32"
    sink_tokens: int = 64
    recent_tokens: int = 256
    lloyd_max: bool = False           # Lloyd-Max INT2 buckets, as SGLANG_LLOYD_MAX=1 (oscar-spec 5)

    def check(self) -> None:
        if self.k_objective not in ("qqt", "ktk", "hadamard"):
            raise InvalidInput(f"k objective {self.k_objective!r}: choose qqt, ktk or hadamard")
        if self.v_objective not in ("sst", "vtv", "hadamard"):
            raise InvalidInput(f"v objective {self.v_objective!r}: choose sst, vtv or hadamard")
        if self.composition not in fit.COMPOSITIONS:
            raise InvalidInput(f"composition {self.composition!r}: choose {', '.join(fit.COMPOSITIONS)}")
        if self.granularity not in ("layer", "kv_head"):
            raise InvalidInput("granularity is layer or kv_head")
        if self.tokens <= 0 or self.seq_len <= 1 or (self.batch_size is not None and self.batch_size <= 0):
            raise InvalidInput("tokens, seq_len and batch_size must be positive")
        if not 0 <= self.seed <= jobspec.MAX_SEED:   # else it fails only at the clip search
            raise InvalidInput(f"seed {self.seed}: use a number from 0 to {jobspec.MAX_SEED}")
        if self.clip_search and (self.clip_windows < 1 or self.clip_queries < 1):
            raise InvalidInput(f"clip search needs clip_windows >= 1 and clip_queries >= 1 (got "
                               f"{self.clip_windows} and {self.clip_queries}); use 2 and 256, or "
                               "turn clip search off")
        jobspec.check_windows(self.sink_tokens, self.recent_tokens,
                              seq_len=self.seq_len if self.clip_search else None)


# A small model's forward on a GPU is launch-bound at one window (on an H100, SmolLM2 kept the
# GPU busy 12% of the time at 1 x 2048 tokens); at ~32K tokens per forward the GPU work covers
# the launches, and our extra ops per layer cost what their arithmetic costs
# (bench/results/calibrate-h100.md). Activations of an 8B model at 32K tokens stay a few GB.
GPU_TOKENS = 32768


def windows_per_forward(cfg: CalibrationConfig, device: torch.device) -> int:
    if cfg.batch_size is not None:
        return cfg.batch_size
    return max(1, GPU_TOKENS // cfg.seq_len) if device.type == "cuda" else 1


def _noop(**_):
    pass


@dataclass
class CalibrationResult:
    bundle: Bundle
    timings: dict[str, float]      # seconds per phase
    tokens_per_pass: int


def calibrate(cfg: CalibrationConfig, progress: Progress = _noop, loaded=None,
              text=None) -> CalibrationResult:
    """Run the whole calibration; `loaded` = (model, tokenizer) to reuse a loaded model, `text`
    = load_text(cfg.data, ...) where the caller read it already (before loading the model)."""
    cfg.check()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    src = resolve_source(cfg.model, cfg.revision)
    if loaded is None:     # a runner that loaded the model has reported the loading already
        text = text or load_text(cfg.data, "calibration", cfg.text_field)   # bad --data: no load
        progress(phase="loading", done=0, total=1)
        model, tok = load_model(src)
        progress(phase="loading", done=1, total=1)   # else its bar stays at 0% once closed
    else:
        model, tok = loaded
    capture.install(model)
    geometry = model_geometry(model)
    # before the passes, not at the first kernel
    jobspec.check_int2_geometry(cfg.group_size, geometry, lloyd_max=cfg.lloyd_max)
    timings["loading"] = time.perf_counter() - t0

    text = text or load_text(cfg.data, "calibration", cfg.text_field)
    n_clip = cfg.clip_windows if cfg.clip_search else 0
    windows = token_windows(tok, text, cfg.seq_len, cfg.tokens + n_clip * cfg.seq_len, cfg.seed,
                            held_out=n_clip)
    calib, held_out = windows[:len(windows) - n_clip], windows[len(windows) - n_clip:]

    fitted = _moments_and_fit(model, calib, cfg, geometry, progress, timings)
    clips = _timed(timings, "clip_search", lambda: _clips(model, held_out, cfg, geometry, fitted, progress))
    bundle = _bundle(cfg, src, model, geometry, text, calib, fitted, clips)
    timings["total"] = time.perf_counter() - t0
    return CalibrationResult(bundle, timings, len(calib) * cfg.seq_len)


def _moments_and_fit(model, calib, cfg, geometry, progress, timings) -> dict[int, "FittedLayer"]:
    """Pass 1, pass 2, and each layer's fit on a host thread as soon as its statistic is final.
    A KV-shared layer's queries join its source's statistic, and it gets the source's fit."""
    moments: dict[int, LayerMoments] = {}
    layers = geometry.layers()
    sources = kv_sources(model.config)          # {KV-shared layer: the layer whose cache it reads}
    stored = [lid for lid in layers if lid not in sources]     # the layers whose K/V are cached

    def update1(m, q, k, v, last_forward):
        _moments(moments, m, k, cfg, reader=m.layer_idx in sources).update_pass1(q, k, v)

    def update2(m, q, k, v, last_forward):
        moments[m.layer_idx].update_pass2(k, v)
        if last_forward:    # the copy is queued behind this layer; the fit waits for release()
            _submit(fitter, [m.layer_idx], "v", moments, cfg, hold=True)

    def pass2():
        # S_v is the stored layers' only: a shared layer's queries are in its source's C already
        _pass(model, calib, cfg, geometry, progress, "pass2", update2, layers=stored)
        fitter.release()    # the host has launched the last forward; the GPU is still running it

    with Fitter(cfg.composition, cfg.granularity == "kv_head") as fitter:
        _timed(timings, "pass1", lambda: _pass(model, calib, cfg, geometry, progress, "pass1", update1))
        _check_layers(geometry, moments)
        _check_finite(moments, layers, "calibration")
        for shared, source in sources.items():
            moments[source].add_queries(moments[shared])
        for group in _same_kind(stored, moments):     # final now: fitted while pass 2 runs
            _submit(fitter, group, "k", moments, cfg)
        if cfg.v_objective == "sst":
            _timed(timings, "pass2", pass2)
        else:
            for group in _same_kind(stored, moments):
                _submit(fitter, group, "v", moments, cfg)
        fitted = _timed(timings, "fitting",
                        lambda: _collect(fitter, moments, cfg, layers, progress, sources))
    timings["fitting_work"] = fitter.busy_s
    return fitted


def _timed(timings, name, fn):
    t = time.perf_counter()
    out = fn()
    for i in range(torch.cuda.device_count()):  # every GPU of a device_map'd model
        torch.cuda.synchronize(i)   # a phase's queued GPU work is its own, not the next phase's
    timings[name] = time.perf_counter() - t
    return out


def _moments(moments: dict, module, k, cfg, reader: bool = False) -> LayerMoments:
    """The layer's statistics; a KV-shared reader's need its queries only (its K/V are its
    source's, counted there), so no key or value Gram products are spent on them."""
    lid = module.layer_idx
    if lid not in moments:
        moments[lid] = LayerMoments(k.shape[1], k.shape[-1],
                                    want_ktk=cfg.k_objective == "ktk" and not reader,
                                    want_vtv=cfg.v_objective == "vtv" and not reader)
    return moments[lid]


class _LastLayerSeen(Exception):
    """Raised by a pass's observer once the last attention layer has been captured."""


def _pass(model, windows, cfg, geometry, progress, phase, update, layers=None) -> None:
    """One forward per batch of windows; update(module, q, k, v, last_forward) per call of a
    layer in `layers` (default: every attention layer)."""
    layers = geometry.layers() if layers is None else layers
    wanted = set(layers)
    last_layer = max(layers)
    total = len(windows) * len(layers)
    done = 0
    batch = windows_per_forward(cfg, model.device)
    last_forward = False

    def observer(module, q, k, v, mask, kw):
        nonlocal done
        if module.layer_idx not in wanted:
            return
        update(module, q, k, v, last_forward)
        done += len(q)
        progress(phase=phase, done=done, total=total, layer=module.layer_idx)
        if module.layer_idx == last_layer:
            # Nothing after the last layer's Q/K/V feeds a moment: its attention, MLP and the LM
            # head would be computed for nothing (a tenth of a forward on a 10-layer model; in
            # pass 2 of a KV-shared model, every shared layer).
            raise _LastLayerSeen

    with capture.observing(observer):
        for start in range(0, len(windows), batch):
            last_forward = start + batch >= len(windows)
            try:
                forward(model, windows[start:start + batch])
            except _LastLayerSeen:
                pass


def forward(model, windows: list[list[int]]):
    ids = torch.tensor(windows, dtype=torch.long, device=model.device)
    # The last position's logits only (a 262K vocabulary over every position costs GBs a
    # window), named by a tensor of positions, not the int 1: Gemma 4 takes an int as leave to
    # run its KV-shared layers on the kept positions alone (_maybe_slice_kv_shared_inputs), so
    # their queries came one per window and the clip search indexed past them. A tensor keeps
    # every position through the decoder and slices before the LM head, for every model. On
    # the CPU: a device_map'd model's last layers may sit on another GPU than the first, and
    # CPU indices serve a tensor on any device.
    last = torch.tensor([ids.shape[1] - 1])
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, logits_to_keep=last)


def _check_layers(geometry, moments) -> None:
    missing = sorted(set(geometry.layers()) - set(moments))
    if missing:
        raise UnsupportedModelError(
            f"layers {missing[:8]} never called transformers' attention interface, so their Q/K/V "
            "cannot be captured; this architecture's attention is not supported")


def _check_finite(moments, layers, text: str) -> None:
    """A model that overflows (fp16 keys, broken weights) names its layer here, not as NaN in
    an eigh or in the written bundle. One host sync for all layers: it runs while the fitter
    thread works, and a sync per layer (with its small kernels) cost a launch-bound pass each."""
    import torch

    layers = list(layers)
    flags = [moments[lid].finite() for lid in layers]     # on each layer's GPU (device_map)
    ok = torch.stack([f.to(flags[0].device) for f in flags]).tolist() if flags else []
    for lid, fine in zip(layers, ok):
        if not fine:
            raise InvalidInput(nonfinite_message(lid, text))


def nonfinite_message(lid: int, text: str) -> str:
    return (f"layer {lid}: the model's queries, keys or values hold NaN or inf on the {text} "
            "text, so no rotation or clip can be fitted to them; check that the model loads "
            "correctly (dtype, weights) or calibrate on other --data")


@dataclass
class FittedLayer:
    rot_k: torch.Tensor
    eig_k: torch.Tensor
    rot_v: torch.Tensor
    eig_v: torch.Tensor
    mean: torch.Tensor | None


def _submit(fitter: Fitter, lids: list[int], side: str, moments, cfg, hold: bool = False) -> None:
    objective = cfg.k_objective if side == "k" else cfg.v_objective
    if objective != "hadamard":
        fitter.submit(lids, side, torch.stack([_side_moment(moments[lid], side, cfg) for lid in lids]), hold)
        return
    for lid in lids:
        m = moments[lid]
        fitter.fixed(lid, side, *fit.fixed_rotation("hadamard", m.head_dim, m.kv_heads,
                                                     cfg.granularity == "kv_head"))


def _same_kind(layers, moments) -> list[list[int]]:
    """Layers that can share one batched eigh: same KV heads, head_dim and device."""
    groups: dict[tuple, list[int]] = {}
    for lid in layers:
        m = moments[lid]
        groups.setdefault((m.kv_heads, m.head_dim, m.m_q.device), []).append(lid)
    return list(groups.values())


def _side_moment(m: LayerMoments, side: str, cfg) -> torch.Tensor:
    """The second moment a side's objective diagonalises, per KV head: [H, d, d]."""
    if side == "v":
        return m.sst_cov() if cfg.v_objective == "sst" else m.v_cov()
    if cfg.k_objective == "qqt":
        return m.q_cov()
    cov = m.k_cov()
    if cfg.key_centering:                                          # the stored keys are centered
        mean = m.k_mean()
        cov = cov - mean[:, :, None] * mean[:, None, :]
    return cov


def _collect(fitter: Fitter, moments, cfg, layers, progress, sources) -> dict[int, FittedLayer]:
    """Every layer's fit; a KV-shared layer's is its source's (the cache it reads is stored in
    that basis), the same object."""
    _check_finite(moments, layers, "calibration")   # pass 2's, before its fits are read
    out = {}
    for i, lid in enumerate(layers):
        if lid in sources:      # a source comes before the first shared layer (kv_sources)
            out[lid] = out[sources[lid]]
        else:
            mean = moments[lid].k_mean().float().cpu() if cfg.key_centering else None
            out[lid] = FittedLayer(*fitter.result(lid, "k"), *fitter.result(lid, "v"), mean)
        progress(phase="fitting", done=i + 1, total=len(layers), layer=lid)
    return out


def _clips(model, held_out, cfg, geometry, fitted, progress,
           sources: dict[int, int] | None = None) -> dict[int, clip_search.LayerClips]:
    """Every layer's clips; sources: kv_sources of the model (read from it when None). A cache
    that KV-shared layers read is searched once its last reader has attended, against the error
    summed over its writer and readers, and each of them gets that one LayerClips."""
    if not cfg.clip_search:
        return {lid: clip_search.LayerClips(torch.full((geometry.kv_heads_of(lid),), cfg.k_clip),
                                            torch.full((geometry.kv_heads_of(lid),), cfg.v_clip))
                for lid in geometry.layers()}
    rows = clip_search.query_rows(cfg.seq_len, cfg.sink_tokens, cfg.recent_tokens,
                                  cfg.clip_queries, cfg.seed)
    # the INT2 the bundle is served with: Lloyd-Max buckets where its model is served so
    quantizer = kernel_quantizer(_dtype(cfg.scale_dtype), model.device, lloyd_max=cfg.lloyd_max)
    sources = kv_sources(model.config) if sources is None else sources
    readers: dict[int, list[int]] = {}
    for shared, source in sources.items():
        readers.setdefault(source, []).append(shared)
    out: dict[int, clip_search.LayerClips] = {}
    layers = geometry.layers()
    # source layer -> (its K, V [B, H, T, d], the Readers seen so far) until its last reader's
    # call: per layer held, its queries and mask at `rows` only (Reader.of)
    waiting: dict[int, tuple] = {}

    def observer(module, q, k, v, mask, kw):
        lid = module.layer_idx
        # a NaN error curve would make every comparison false and pick the harshest clip
        if not bool(torch.isfinite(q).all() & torch.isfinite(k).all() & torch.isfinite(v).all()):
            raise InvalidInput(nonfinite_message(lid, "held-out"))
        owner = sources.get(lid, lid)
        if owner == lid:
            waiting[lid] = (k, v, [])
        cache_k, cache_v, group = waiting[owner]
        allowed = capture.bool_mask(mask, q.shape[2], k.shape[2], q.device)
        group.append(clip_search.Reader.of(module, q, allowed, kw.get("scaling") or q.shape[-1] ** -0.5,
                                           rows))
        if len(group) <= len(readers.get(owner, ())):
            return                                      # readers of this cache are still to come
        del waiting[owner]
        f = fitted[owner]
        found = clip_search.search_cache(
            group, cache_k, cache_v, f.rot_k.to(cache_k.device), f.rot_v.to(cache_k.device), f.mean,
            group_size(cfg, geometry), cfg.sink_tokens, cfg.recent_tokens, quantizer,
            cfg.clip_per_head)
        for member in [owner, *readers.get(owner, ())]:
            out[member] = found
            progress(phase="clip_search", done=len(out), total=len(layers), layer=member,
                     k_clip=float(found.k.mean()), v_clip=float(found.v.mean()))

    with capture.observing(observer):
        forward(model, held_out)
    unread = sorted(set(layers) - set(out))
    if unread:      # a cache whose readers never all attended: not a layout kv_sources knows
        raise UnsupportedModelError(
            f"the clip search saw no attention call of layers {unread[:8]} in one forward "
            "(KV-shared layers that never read their source's cache?); calibrate with "
            "--no-clip-search, or report the model")
    return {lid: out[lid] for lid in layers}


def group_size(cfg, geometry) -> int:
    """One for the whole bundle, as its manifest records one (and serving takes one flag): by
    default 128, or the smallest head_dim below that. calibrate() checked it against every
    head_dim (jobspec.check_int2_geometry, whose default is this one)."""
    return cfg.group_size or min(128, min(geometry.head_dim_of(i) for i in geometry.layers()))


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


# --- the bundle ------------------------------------------------------------------------------

def _method(cfg) -> Method:
    # a Hadamard side is H alone, with no fitted factor to compose (OSCAR names it bare)
    k_comp = "none" if cfg.k_objective == "hadamard" else cfg.composition
    v_comp = "none" if cfg.v_objective == "hadamard" else cfg.composition
    return Method(k_objective=cfg.k_objective, v_objective=cfg.v_objective, composition=k_comp,
                  v_composition=None if v_comp == k_comp else v_comp,
                  granularity=cfg.granularity, key_centering=cfg.key_centering)


def _bundle(cfg, src, model, geometry, text, calib, fitted, clips) -> Bundle:
    k_vals = torch.cat([c.k for c in clips.values()]).numpy()
    v_vals = torch.cat([c.v for c in clips.values()]).numpy()
    if cfg.clip_search:
        # each stored cache once: KV-shared layers hold their source's LayerClips, whose curves
        # sum the errors of all its readers already
        searched = list({id(c): c for c in clips.values()}.values())
        k_global = clip_search.global_pair([c.k_curve for c in searched])
        v_global = clip_search.global_pair([c.v_curve for c in searched])
        gran = "kv_head" if cfg.clip_per_head else "layer"
    else:
        k_global, v_global, gran = cfg.k_clip, cfg.v_clip, "global"
    manifest = Manifest(
        model=ModelRef(name=src.name, hub_id=src.hub_id,
                       revision=loaded_revision(model.config, cfg.revision),
                       architecture=(getattr(model.config, "architectures", None) or [None])[0]),
        geometry=Geometry.of(geometry),
        method=_method(cfg),
        quantization=Quantization(group_size=group_size(cfg, geometry),
                                  scale_dtype=cfg.scale_dtype, sink_tokens=cfg.sink_tokens,
                                  recent_tokens=cfg.recent_tokens, lloyd_max=cfg.lloyd_max),
        clip=Clip(granularity=gran, searched=cfg.clip_search, k_global=k_global, v_global=v_global,
                  k_min=float(k_vals.min()), k_median=float(np.median(k_vals)), k_max=float(k_vals.max()),
                  v_min=float(v_vals.min()), v_median=float(np.median(v_vals)), v_max=float(v_vals.max())),
        calibration=Calibration(
            dataset=text.name, dataset_sha256=text.sha256, tokens=len(calib) * cfg.seq_len,
            prompts=len(calib), seq_len=cfg.seq_len, seed=cfg.seed, code_version=__version__,
            torch_version=torch.__version__, transformers_version=_transformers_version(),
            hardware=hardware(), created_at=utc_now(), spec=asdict(cfg)),
    )
    bundle = Bundle(manifest)
    np32 = lambda t: None if t is None else t.detach().cpu().float().numpy()  # noqa: E731
    for lid, f in fitted.items():
        bundle.k[lid] = SideTensors(np32(f.rot_k), np32(clips[lid].k), np32(f.eig_k), np32(f.mean))
        bundle.v[lid] = SideTensors(np32(f.rot_v), np32(clips[lid].v), np32(f.eig_v))
    return bundle


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def hardware() -> str:
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n} x {torch.cuda.get_device_name(0)}"
    import os

    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
