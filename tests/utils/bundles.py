"""Valid random bundles for catalog models, cheap enough to make in every test.

    make_bundle(tmp_path / "b", model="smollm2-135m", per_head=False, seed=0, centered=False)

Same arguments give byte-identical bundles (and so the same digest): the timestamp is fixed.
Rotations are random orthogonal matrices (QR of a Gaussian, signs fixed), float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oscar_zoo.zoo import __version__
from oscar_zoo.zoo.bundle import Bundle, SideTensors, write
from oscar_zoo.zoo.catalog import lookup
from oscar_zoo.zoo.manifest import (Calibration, Clip, Geometry, Manifest, Method, ModelRef,
                                    Quantization)


def random_orthogonal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """[..., d, d] orthogonal, float32 (QR in float64, then cast)."""
    a = rng.standard_normal(shape)
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    return q.astype(np.float32)


def make_manifest(model: str = "smollm2-135m", per_head: bool = False, seed: int = 0,
                  centered: bool = False, k_clip: float = 0.96, v_clip: float = 0.92) -> Manifest:
    entry = lookup(model)
    return Manifest(
        model=ModelRef(name=entry.name, hub_id=entry.hub_id, architecture=entry.architecture),
        geometry=Geometry.of(entry.geometry),
        method=Method(k_objective="qqt", v_objective="sst", composition="r_h_pbr",
                      granularity="kv_head" if per_head else "layer", key_centering=centered),
        quantization=Quantization(group_size=entry.group_size, sink_tokens=entry.sink_tokens,
                                  recent_tokens=entry.recent_tokens),
        clip=Clip(granularity="global", k_global=k_clip, v_global=v_clip, k_min=k_clip,
                  k_median=k_clip, k_max=k_clip, v_min=v_clip, v_median=v_clip, v_max=v_clip),
        calibration=Calibration(source="calibrated", dataset="synthetic", tokens=1000 + seed,
                                seed=seed, code_version=__version__,
                                created_at="2026-11-22T00:00:00Z"))


def make_tensors(manifest: Manifest, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    geo = manifest.geometry.to_geometry()
    per_head = manifest.method.granularity == "kv_head"
    sides: dict[str, dict[int, SideTensors]] = {"k": {}, "v": {}}
    for layer in geo.layers():
        d, h = geo.head_dim_of(layer), geo.kv_heads_of(layer)
        for side, clip in (("k", manifest.clip.k_global), ("v", manifest.clip.v_global)):
            lead = (h,) if per_head else ()
            eig = np.sort(rng.gamma(2.0, size=lead + (d,)))[..., ::-1].astype(np.float32)
            mean = (rng.standard_normal((h, d)).astype(np.float32)
                    if side == "k" and manifest.method.key_centering else None)
            sides[side][layer] = SideTensors(
                rotation=random_orthogonal(rng, *lead, d, d),
                clip=np.full((h,), clip, np.float32), eigenvalues=np.ascontiguousarray(eig),
                mean=mean)
    return sides["k"], sides["v"]


def make_bundle(out_dir: str | Path, model: str = "smollm2-135m", per_head: bool = False,
                seed: int = 0, centered: bool = False, **clips: float) -> Bundle:
    """Write a valid bundle for a catalog model to out_dir (which must not exist) and return it."""
    manifest = make_manifest(model, per_head, seed, centered, **clips)
    k, v = make_tensors(manifest, seed)
    return write(Bundle(manifest, k, v), out_dir)
