"""Validate a bundle on held-out text with the KV cache simulated in INT2 (oscar-spec 3).

Every layer's K and V go through the INT2 kernels in the storage format serving uses (rotate,
center keys, clip, quantize, pack, dequantize); attention is then computed exactly per query
over the sink / INT2 history / recent tiers. A KV-shared layer (Gemma 3n, Gemma 4) reads the
INT2 cache its source layer wrote, as an engine that stores it once serves it. In the same run,
three baselines get the same treatment: "oscar-shipped" (the bundle's rotations, OSCAR's global
clip, no centering), "hadamard" (QuaRot-style, data-free) and "naive" (no rotation).

Reported per variant: extra next-token loss (nats/token) and KL(BF16 || INT2) per token, natural
log, against the unquantized model on the same tokens (its attention computed by the same code
over an all-BF16 cache, so only the INT2 tier differs), each on two disjoint evaluation sets (a
noise estimate), and the attention-output relative error per layer (teacher-forced: every variant
sees the unquantized model's inputs at every layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oscar_zoo.zoo import __version__
from oscar_zoo.zoo.bundle import Bundle
from oscar_zoo.zoo.catalog import find
from oscar_zoo.zoo.errors import InvalidInput
from oscar_zoo.zoo.manifest import SERVED, Validation, VariantResult, utc_now, verdict

from . import capture, fit, jobspec
from .cache_bits import cache_bits, check_kv_shared_tensors, kv_shared_layers, kv_sources, layer_windows
from .data import BUILTIN, adds_bos, load_text
from .int2_attention import CacheSpec, Quantizer, dequantized, mixed_attention
from .loading import model_geometry
from .pipeline import hardware

SCALE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}
BASELINES = ("oscar-shipped", "hadamard", "naive")


@dataclass
class ValidationConfig:
    data: list[str] = field(default_factory=lambda: [BUILTIN])
    text_field: str = "text"
    context_len: int = 2048
    windows: int = 6                  # split alternately into evaluation sets A and B
    tolerance: float = 0.05           # nats/token the bundle may lose to the Hadamard baseline
    naive_fraction: float = 0.5       # ... and it must stay below this fraction of naive INT2's
    baselines: tuple[str, ...] = ("oscar-shipped", "hadamard", "naive")

    def check(self, sink: int, recent: int) -> None:
        """Before any forward: settings under which validation would measure nothing."""
        if self.windows < 1:
            raise InvalidInput(f"windows {self.windows}: validate on at least 1 window (6, the "
                               "default, gives two sets for a noise estimate)")
        if not (math.isfinite(self.tolerance) and math.isfinite(self.naive_fraction)):
            raise InvalidInput(f"tolerance {self.tolerance} and naive_fraction {self.naive_fraction} "
                               "must be finite numbers (e.g. --tolerance 0.05)")
        jobspec.check_windows(sink, recent, context_len=self.context_len)
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:     # else a variant with no layers fails with a KeyError at the first forward
            raise InvalidInput(f"unknown baselines {unknown}: choose from {', '.join(BASELINES)}")


def check_geometry_of(bundle: Bundle, have) -> None:
    """InvalidInput naming what differs when the bundle was calibrated for another geometry
    than `have`, a ModelGeometry (a catalog model's is known before its load): its rotations
    would meet layers (or heads) they were not made for."""
    want = bundle.manifest.geometry.to_geometry()
    diffs = [f"{name} {getattr(want, name)} in the bundle, {getattr(have, name)} in the model"
             for name in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim")
             if getattr(want, name) != getattr(have, name)]
    if want.layers() != have.layers():
        if want.num_layers == have.num_layers:   # else the count above says it already
            diffs.append(f"attention layers {want.layers()} in the bundle, {have.layers()} in the model")
    else:   # per-layer sizes only matter (and only make sense) over the same layers
        for what, of in (("head_dim", "head_dim_of"), ("kv heads", "kv_heads_of")):
            bad = [i for i in want.layers() if getattr(want, of)(i) != getattr(have, of)(i)]
            if bad:
                diffs.append(f"{what} differs on layers {bad[:8]}")
    if diffs:
        name = bundle.manifest.model.name
        raise InvalidInput(f"this bundle was calibrated for {name}, whose geometry the model "
                           f"does not share ({'; '.join(diffs)}): validate it with the model it "
                           "was calibrated on (--model left out picks it by name)")


def check_held_out(bundle: Bundle, data: list[str], text_field: str, src) -> None:
    """InvalidInput when the held-out text is the bundle's calibration text or part of it: by
    sha256 (the whole, or one source of several), or by name (one of several sources the
    calibration read: their own hashes are not recorded). Only the built-in corpus has
    split halves; a file or hf: dataset gives its whole text to both, and the clips and
    rotations would be scored on the text they were fitted to."""
    cal = bundle.manifest.calibration
    if cal.dataset_sha256 is None and cal.dataset is None:   # imported: nothing known of its text
        return
    same = [src.name] if src.sha256 == cal.dataset_sha256 else []
    if not same and cal.dataset_sha256 is not None and len(data) > 1:
        same = [s for s in data if s != BUILTIN
                and load_text([s], "heldout", text_field).sha256 == cal.dataset_sha256]
    read = calibration_sources(bundle)
    if not same and len(read) > 1:
        # calibrated on several sources (a.txt and b.txt), validated on one of them (a.txt): no
        # hash above matches, though every held-out token was calibration text. By name, as a
        # job spec is checked (jobspec.check): one source's own hash is not recorded
        keys = {_source_key(s) for s in read} - {BUILTIN}
        same = [s for s in data if _source_key(s) in keys]
    if same:
        raise InvalidInput(f"held-out text {', '.join(same)} is this bundle's calibration text "
                           f"or part of it ({cal.dataset}), so validation would score it "
                           f"on the text it was fitted to: validate with other --data (default: "
                           f"{BUILTIN}, whose held-out half calibration never reads)")


def calibration_sources(bundle: Bundle) -> list[str]:
    """The --data sources the bundle was calibrated on, as they were named: a job's spec lists
    them; otherwise its dataset name joins them with commas (and ends in #calibration when
    the built-in corpus was one)."""
    cal = bundle.manifest.calibration
    listed = (cal.spec or {}).get("data")
    if isinstance(listed, list) and all(isinstance(s, str) for s in listed):
        return list(listed)
    name = cal.dataset or ""
    if name.endswith("#calibration"):
        name = name[:-len("#calibration")]
    return [s for s in name.split(",") if s]


def _source_key(spec: str) -> str:
    """One spelling per source: hf: refs with their default split, paths resolved."""
    if spec == BUILTIN:
        return spec
    if spec.startswith("hf:"):
        return spec if "@" in spec else spec + "@train"
    return str(Path(spec).expanduser().resolve())


def held_out_text(bundle: Bundle, cfg: ValidationConfig):
    """The held-out text, read and checked against the bundle's calibration text. Needs no
    model: callers run it before loading one, so a missing file or a JSON line without the
    text field is refused at once, not after minutes of loading."""
    src = load_text(cfg.data, "heldout", cfg.text_field)
    check_held_out(bundle, cfg.data, cfg.text_field, src)
    return src


def eval_windows(tokenizer, src, seq_len: int, n: int):
    """(src, n evenly spaced windows of it): src is the held-out text, load_text(data,
    "heldout", ...) (of the built-in corpus, its second half)."""
    ids = tokenizer(src.text, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    body = seq_len - len(bos)
    if len(ids) < n * body:
        raise InvalidInput(f"validation data {src.name} has {len(ids):,} tokens, {n} x {seq_len} "
                           "needed: lower --windows or --context-len (validation.windows or "
                           "validation.context_len in a job spec), or add validation --data")
    stride = (len(ids) - body) // max(n - 1, 1)
    return src, [bos + ids[i * stride:i * stride + body] for i in range(n)]


def variant_specs(bundle: Bundle, names: tuple[str, ...]) -> dict[str, dict[int, CacheSpec]]:
    """Per variant, per layer, the INT2 cache settings."""
    m = bundle.manifest
    g = m.quantization.group_size
    entry = find(m.model.name) or find(m.model.hub_id)
    shipped = (entry.k_clip, entry.v_clip) if entry else (0.96, 0.92)
    out: dict[str, dict[int, CacheSpec]] = {"bundle": {}}
    # Engines take one K and one V clip ratio (SGLang, vLLM): per-layer searched clips are
    # measured as engines will serve them too, beside the per-layer number
    served = m.clip.granularity != "global"
    if served:
        out[SERVED] = {}
    for name in names:
        out[name] = {}
    for lid in bundle.layers:
        k, v = bundle.k[lid], bundle.v[lid]
        t = lambda a: torch.from_numpy(a).float()  # noqa: E731
        rk, rv, heads = t(k.rotation), t(v.rotation), k.clip.shape[0]
        d = rk.shape[-1]
        out["bundle"][lid] = CacheSpec(rk, rv, t(k.clip), t(v.clip),
                                       None if k.mean is None else t(k.mean), g)
        full = lambda x: torch.full((heads,), x)  # noqa: E731
        if served:
            out[SERVED][lid] = CacheSpec(rk, rv, full(m.clip.k_global), full(m.clip.v_global),
                                         None if k.mean is None else t(k.mean), g)
        if "oscar-shipped" in names:
            out["oscar-shipped"][lid] = CacheSpec(rk, rv, full(shipped[0]), full(shipped[1]), None, g)
        if "hadamard" in names:
            h = fit.hadamard(d).float()
            out["hadamard"][lid] = CacheSpec(h, h, full(0.0), full(0.0), None, g)
        if "naive" in names:
            eye = torch.eye(d)
            out["naive"][lid] = CacheSpec(eye, eye, full(0.0), full(0.0), None, g)
    return out


def stored_once(specs: dict[str, dict[int, CacheSpec]],
                sources: dict[int, int]) -> dict[str, dict[int, CacheSpec]]:
    """specs with each KV-shared layer given its source layer's settings (kv_sources).

    transformers hands a shared layer the very K/V tensors its source layer attended with; an
    engine stores them once, in the source's INT2 format, and the shared layer reads that
    cache. Quantizing them again with the shared layer's own bundle tensors emulated a cache
    no engine holds. The same settings on the same tensors give the same INT2 rows (the
    quantizers are deterministic), so the reader sees exactly what its source wrote."""
    return {name: {lid: per_layer[sources.get(lid, lid)] for lid in per_layer}
            for name, per_layer in specs.items()}


class _LayerErrors:
    """Sums of ||o_variant - o_ref||^2 and ||o_ref||^2 per (variant, layer)."""

    def __init__(self):
        self.err: dict[tuple[str, int], float] = {}
        self.ref: dict[tuple[str, int], float] = {}

    def add(self, name, lid, o, o_ref):
        key = (name, lid)
        self.err[key] = self.err.get(key, 0.0) + float(((o.float() - o_ref.float()) ** 2).sum())
        self.ref[key] = self.ref.get(key, 0.0) + float((o_ref.float() ** 2).sum())

    def per_layer(self, name, layers) -> list[float]:
        return [(self.err[(name, lid)] / max(self.ref[(name, lid)], 1e-30)) ** 0.5 for lid in layers]


def _int2(spec: CacheSpec, k, v, quantizer: Quantizer):
    return (dequantized(k, spec.rot_k.to(k.device), spec.clip_k, spec.group_size, spec.mean, quantizer),
            dequantized(v, spec.rot_v.to(v.device), spec.clip_v, spec.group_size, None, quantizer))


def _check_finite(q, k, v, lid: int) -> None:
    # The INT2 kernels leave a row with NaN or inf in it unspecified (the float64 reference gives
    # NaN): a model that overflows would be scored on garbage instead of being named. Queries
    # too: they make the reference loss NaN, which the manifest refuses only after the whole run
    if not bool(torch.isfinite(k).all() & torch.isfinite(v).all()):
        _nonfinite(lid, "keys or values", k.dtype)
    if not bool(torch.isfinite(q).all()):
        _nonfinite(lid, "queries", q.dtype)


def _nonfinite(lid, what: str, dtype) -> None:
    raise InvalidInput(f"layer {lid}: the model's own {what} hold NaN or inf on the held-out "
                       f"text (in {dtype}), so INT2 quality cannot be measured; check that the "
                       "model loads correctly (dtype, weights) or validate with other --data")


# attention arguments that change its math and that mixed_attention does not compute (Gemma 2's
# logit soft-capping, gpt-oss's learned sinks): the reference and every variant would drop them
_UNMODELLED = ("softcap", "s_aux")


def _attention_args(q, k, mask, kw, lid: int):
    bad = [name for name in _UNMODELLED if kw.get(name) is not None]
    if bad:
        raise InvalidInput(f"layer {lid}: the model's attention takes {', '.join(bad)}, which "
                           "the INT2-cache emulation does not compute, so validation cannot "
                           "measure this model")
    return capture.bool_mask(mask, q.shape[2], k.shape[2], q.device), kw.get("scaling") or q.shape[-1] ** -0.5


def _measure_observer(specs, errors: _LayerErrors, sink, recent, quantizer):
    """The BF16 reference pass: each layer's attention over an all-BF16 cache, computed by the
    same code (and arithmetic) as the INT2 variants' and returned as the layer's output, so that
    the extra loss and KL measure the INT2 tier only. SDPA's output here put the difference
    between its kernel and ours into every variant's numbers: on a bfloat16 model a lossless
    INT2 tier showed +0.002 nats and a KL of 1.6e-4. Attention errors are summed over the query
    positions that read INT2 keys (past sink + recent): the others are exact in every variant."""
    def observer(module, q, k, v, mask, kw):
        _check_finite(q, k, v, module.layer_idx)
        allowed, scaling = _attention_args(q, k, mask, kw, module.layer_idx)
        ref = mixed_attention(q, k, v, allowed, scaling, k, v, sink, recent)
        rows = torch.arange(min(sink + recent, q.shape[2]), q.shape[2], device=q.device)
        if len(rows) == 0:
            return ref
        for name, per_layer in specs.items():
            k_i, v_i = _int2(per_layer[module.layer_idx], k, v, quantizer)
            errors.add(name, module.layer_idx, mixed_attention(q, k, v, allowed, scaling, k_i, v_i,
                                                               sink, recent, rows), ref[:, rows])
        return ref
    return observer


def _replace_observer(per_layer, sink, recent, quantizer):
    def observer(module, q, k, v, mask, kw):
        _check_finite(q, k, v, module.layer_idx)
        allowed, scaling = _attention_args(q, k, mask, kw, module.layer_idx)
        k_i, v_i = _int2(per_layer[module.layer_idx], k, v, quantizer)
        return mixed_attention(q, k, v, allowed, scaling, k_i, v_i, sink, recent)
    return observer


def _logprobs(model, window) -> torch.Tensor:
    ids = torch.tensor([window], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)                                   # [T-1, V]


def validate(bundle: Bundle, model, tokenizer, cfg: ValidationConfig, quantizer: Quantizer,
             progress=lambda **kw: None, held_out=None, text=None) -> Validation:
    """held_out: eval_windows(...) of cfg, where the caller made them already (the job runner
    checks them before calibrating); else text: load_text(cfg.data, "heldout", ...), where the
    caller read it already (before loading the model)."""
    m = bundle.manifest
    sink, recent = m.quantization.sink_tokens, m.quantization.recent_tokens
    cfg.check(sink, recent)
    geometry = model_geometry(model)
    check_geometry_of(bundle, geometry)
    # what each layer's cache holds, read from the config now: one it cannot read fails before
    # hours of evaluation, not after
    sources = kv_sources(model.config)      # first: it names what an all-shared model is
    check_kv_shared_tensors(bundle, sources)
    bits = _bits_at_context(m.quantization, cfg.context_len, geometry, model.config)
    src, windows = held_out or eval_windows(
        tokenizer, text or load_text(cfg.data, "heldout", cfg.text_field), cfg.context_len,
        cfg.windows)
    check_held_out(bundle, cfg.data, cfg.text_field, src)
    specs = stored_once(variant_specs(bundle, cfg.baselines), sources)
    capture.install(model)
    errors = _LayerErrors()
    nll = {name: [0.0, 0.0] for name in ["bf16", *specs]}
    kl = {name: [0.0, 0.0] for name in specs}
    tokens = [0, 0]
    # the count only this function knows (a searched bundle adds its served-clip variant):
    # said at once, as the first forward takes a while
    steps = len(windows) * (1 + len(specs))
    progress(phase="validating", done=0, total=steps)
    for w, window in enumerate(windows):
        s = w % 2
        targets = torch.tensor(window[1:], device=model.device)
        with capture.observing(_measure_observer(specs, errors, sink, recent, quantizer)):
            ref = _logprobs(model, window)
        if not bool(torch.isfinite(ref).all()):   # past the last attention layer (norm, head)
            raise InvalidInput("the model's own next-token log-probabilities hold NaN or inf on "
                               "the held-out text, so INT2 quality cannot be measured; check that "
                               "the model loads correctly (dtype, weights) or validate with other --data")
        nll["bf16"][s] += float(-ref.gather(1, targets[:, None]).sum())
        tokens[s] += len(targets)
        progress(phase="validating", done=w * (1 + len(specs)) + 1, total=steps, variant="bf16")
        for i, (name, per_layer) in enumerate(specs.items()):
            with capture.observing(_replace_observer(per_layer, sink, recent, quantizer)):
                lp = _logprobs(model, window)
            nll[name][s] += float(-lp.gather(1, targets[:, None]).sum())
            kl[name][s] += float((ref.exp() * (ref - lp)).sum())
            progress(phase="validating", done=w * (1 + len(specs)) + 2 + i, total=steps, variant=name)
    return _report(bundle, cfg, src, windows, specs, errors, nll, kl, tokens, sink, recent, quantizer,
                   bits)


def _int2_tier_bits(q) -> float:
    """Bits per element of the INT2 tier: 2-bit codes plus a scale and a zero per group."""
    return 2 + 2 * SCALE_BITS[q.scale_dtype] / q.group_size


def _bits_at_context(q, context_len: int, geometry, config) -> tuple[float, dict[str, int]]:
    """(bits_at_context, window_by_layer) of a cache quantized as `q` (a manifest's
    Quantization) at context_len, for the model of `geometry` and `config` (its transformers
    config, live or a config.json dict). Counted: the layers that store K/V, geometry.layers()
    (a hybrid's linear-attention layers have no cache) less the KV-shared ones."""
    shared = kv_shared_layers(config)
    layers = [i for i in geometry.layers() if i not in shared]
    if not layers:
        raise InvalidInput("every attention layer of this model reuses another's keys and "
                           "values (num_kv_shared_layers): it keeps no KV cache to validate")
    spans = layer_windows(config)
    kept = [spans[i] for i in layers]
    widths = [geometry.kv_heads_of(i) * geometry.head_dim_of(i) for i in layers]
    bits = cache_bits(_int2_tier_bits(q), q.sink_tokens, q.recent_tokens, context_len, kept, widths)
    # only windows below context_len: a layer with a longer one holds the whole context like a
    # full layer, and a report without the field stays readable by clients from before it
    # (zoo/manifest.py, Validation.window_by_layer)
    return bits, {str(i): w for i, w in zip(layers, kept, strict=True)
                  if w is not None and w < context_len}


def _report(bundle, cfg, src, windows, specs, errors, nll, kl, tokens, sink, recent, quantizer,
            bits) -> Validation:
    """bits: _bits_at_context(...), that is (bits_at_context, window_by_layer)."""
    m = bundle.manifest
    # One window fills set A only: an empty set B is left out, not reported as a loss of 0.
    per_set = lambda xs: [x / t for x, t in zip(xs, tokens) if t]  # noqa: E731
    total = lambda xs: sum(xs) / max(sum(tokens), 1)                  # noqa: E731
    bf16_sets = per_set(nll["bf16"])
    results = []
    for name in specs:
        layers = errors.per_layer(name, bundle.layers)
        results.append(VariantResult(
            name=name, delta_nll=total(nll[name]) - total(nll["bf16"]), kl=total(kl[name]),
            attn_rel_error=sum(layers) / len(layers), per_layer_attn_rel_error=layers,
            delta_nll_by_set=[a - b for a, b in zip(per_set(nll[name]), bf16_sets)]))
    # one rule, which the registry applies to an uploaded report too (zoo.manifest.verdict)
    ok, criterion = verdict({r.name: r for r in results}, cfg.tolerance, cfg.naive_fraction)
    bits_at_context, window_by_layer = bits
    return Validation(
        passed=ok, criterion=criterion,
        tolerance=cfg.tolerance, dataset=src.name, context_len=cfg.context_len,
        eval_windows=len(windows), eval_tokens=sum(tokens), sink_tokens=sink, recent_tokens=recent,
        group_size=m.quantization.group_size, scale_dtype=m.quantization.scale_dtype,
        bf16_nll=total(nll["bf16"]), bits_int2_tier=_int2_tier_bits(m.quantization),
        bits_at_context=bits_at_context, window_by_layer=window_by_layer,
        variants=results, created_at=utc_now(), code_version=__version__, hardware=hardware(),
        int2_backend=getattr(quantizer, "backend", None),
        quantizer=getattr(quantizer, "kind", "uniform"))
