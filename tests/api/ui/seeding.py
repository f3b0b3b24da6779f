"""Bundles with a validation report, and many model rows cheaply, for the UI tests and bench/ui.py.

    make_validated_bundle(tmp / "b", model="smollm2-135m", seed=3)
    make_validated_bundle(tmp / "b", name="bench-007", hub_id="bench/m-007", seed=1)
    make_validated_bundle(tmp / "b", name="deep", layers=600)    # 600 small layers
    add_bulk_models(registry.db, 10_000)     # rows only, no files: the home page at scale

The per-layer attention errors are random but ordered as real runs are (bundle < OSCAR as shipped
< Hadamard < naive), so charts and tables look like the real thing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from oscar_zoo.zoo import __version__
from oscar_zoo.zoo.bundle import Bundle, write
from oscar_zoo.zoo.manifest import Clip, Geometry, ModelRef, Validation, VariantResult, criterion_text

from tests.utils.bundles import make_manifest, make_tensors

SCALE = {"bundle": 1.0, "bundle-served": 1.2, "oscar-shipped": 1.6, "hadamard": 2.2, "naive": 9.0}
# a failed report's bundle loses this many times more: above its criterion's bound, as the
# registry re-derives the verdict from the numbers and refuses a report they contradict
FAILED = 6.0


def validation(n_layers: int, seed: int, passed: bool = True) -> Validation:
    rng = np.random.default_rng(seed + 1000)
    base = rng.uniform(0.02, 0.06, n_layers)
    variants = []
    for name, scale in SCALE.items():
        loss = scale * (FAILED if not passed and name.startswith("bundle") else 1.0)
        per_layer = (base * scale * rng.uniform(0.9, 1.1, n_layers)).round(5).tolist()
        variants.append(VariantResult(
            name=name, delta_nll=round(0.004 * loss * (1 + seed % 5 / 10), 5),
            kl=round(0.003 * scale, 5), attn_rel_error=round(float(np.mean(per_layer)), 5),
            per_layer_attn_rel_error=per_layer, delta_nll_by_set=[]))
    return Validation(
        passed=passed, criterion=criterion_text(0.01, 0.5, served="bundle-served" in SCALE),
        tolerance=0.01, dataset="wikitext-2 test", context_len=4096, eval_windows=8,
        eval_tokens=32768, sink_tokens=64, recent_tokens=256, group_size=128,
        scale_dtype="float32", bf16_nll=2.3456, bits_int2_tier=2.5, bits_at_context=3.28,
        variants=variants, created_at="2026-11-22T00:00:00Z", code_version=__version__,
        hardware="test")


def make_validated_bundle(out_dir: str | Path, model: str = "smollm2-135m", seed: int = 0,
                          per_head: bool = False, centered: bool = False, passed: bool = True,
                          name: str | None = None, hub_id: str | None = None,
                          architecture: str | None = None, layers: int | None = None) -> Bundle:
    """A valid bundle with a validation report; name/hub_id make it a new (uploaded) model with
    `model`'s geometry, or with `layers` small layers (1 KV head of dim 16: cheap to make)."""
    manifest = make_manifest(model, per_head, seed, centered)
    if name:
        manifest = manifest.model_copy(update={"model": ModelRef(
            name=name, hub_id=hub_id or f"bench/{name}", architecture=architecture)})
    if layers:
        assert name, "a new geometry needs a new model: pass name"
        manifest = manifest.model_copy(update={
            "geometry": Geometry(num_layers=layers, num_q_heads=2, num_kv_heads=1, head_dim=16),
            "quantization": manifest.quantization.model_copy(update={"group_size": 16})})
    n_layers = len(manifest.geometry.to_geometry().layers())
    manifest = manifest.model_copy(update={"validation": validation(n_layers, seed, passed)})
    k, v = make_tensors(manifest, seed)
    manifest = manifest.model_copy(update={"clip": searched_clips(k, v, seed)})
    return write(Bundle(manifest, k, v), out_dir)


def searched_clips(k: dict, v: dict, seed: int) -> Clip:
    """Give every (layer, KV head) its own clip ratio, as the clip search does, and summarise."""
    rng = np.random.default_rng(seed + 2000)
    summary = {}
    for side, tensors, centre in (("k", k, 0.95), ("v", v, 0.90)):
        for t in tensors.values():
            t.clip[:] = np.clip(centre + rng.normal(0, 0.02, t.clip.shape), 0.8, 1.0)
        values = np.concatenate([t.clip for t in tensors.values()]).astype(float)
        summary.update({f"{side}_global": round(float(np.median(values)), 2),
                        f"{side}_min": float(values.min()), f"{side}_median": float(np.median(values)),
                        f"{side}_max": float(values.max())})
    return Clip(granularity="kv_head", searched=True, **summary)


def add_bulk_models(db, n: int, prefix: str = "bulk", spread: int = 997) -> list[str]:
    """`n` models (PREFIX-000000, ...) of smollm2-135m's geometry written straight into the
    database as publish would leave them, without files (their versions' pages cannot render):
    many, cheaply, for the home page's lists. Model i has 3 versions: for i % 7 == 0 drafts
    only (nothing published: no alias, no headline); else v1 and v2 published, v3 published,
    a draft or yanked by i % 3, `latest` on the newest published and `recommended` on v1 for
    i % 4 == 0. Reports on every version but model i % 10 == 0's (one in three failed);
    `spread` distinct extra losses and upload times (the newest of them 2026-01-01 plus
    spread - 1 minutes), so a small spread makes ties. Returns the names, in i order."""
    from datetime import datetime, timedelta, timezone

    from oscar_zoo.registry_db.models import Alias, BundleVersion, Model, extra_loss
    from sqlalchemy import select

    with db.read() as session:
        geometry = session.scalar(select(Model.geometry).where(Model.name == "smollm2-135m"))
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    made = []
    for first in range(0, n, 1000):
        names = [f"{prefix}-{i:06d}" for i in range(first, min(n, first + 1000))]
        made += names
        with db.write() as session:
            session.execute(Model.__table__.insert(), [
                dict(name=name, hub_id=f"{prefix}-org/{name}", hub_id_lower=f"{prefix}-org/{name}",
                     architecture=f"BulkArch{i % 5}", aliases=[], geometry=geometry,
                     geometry_verified=True, source="upload", created_at=start)
                for i, name in enumerate(names, first)])
            ids = dict(session.execute(select(Model.name, Model.id).where(Model.name.in_(names))).all())
            rows = []
            for i, name in enumerate(names, first):
                for number in (1, 2, 3):
                    status = ("draft" if i % 7 == 0 else "published" if number < 3 else
                              ("published", "draft", "yanked")[i % 3])
                    report = None if i % 10 == 0 else {
                        "passed": (i + number) % 3 != 0,
                        "variants": [{"name": "bundle", "delta_nll": 0.004 + (i * 37 + number) % spread * 1e-5},
                                     {"name": "naive", "delta_nll": 0.036}]}
                    rows.append(dict(
                        model_id=ids[name], number=number, status=status,
                        yank_reason="bulk" if status == "yanked" else None,
                        digest=f"{i:058d}{number:06d}", size=1_000_000 + number * 1000 + i % 100,
                        method={"granularity": "layer"}, quantization={}, calibration={},
                        clip={"k_global": 0.95, "v_global": 0.9}, manifest={},
                        validation=report, validation_passed=report and report["passed"],
                        extra_loss=extra_loss(report),
                        created_at=start + timedelta(minutes=(i * 7919 + number * 60) % spread),
                        created_by="bulk"))
            session.execute(BundleVersion.__table__.insert(), rows)
            versions = {(m, number): v for m, number, v in session.execute(
                select(BundleVersion.model_id, BundleVersion.number, BundleVersion.id)
                .where(BundleVersion.model_id.in_(ids.values())))}
            aliases = []
            for i, name in enumerate(names, first):
                if i % 7 == 0:
                    continue
                newest = 3 if i % 3 == 0 else 2
                aliases.append(dict(model_id=ids[name], name="latest", updated_at=start,
                                    version_id=versions[ids[name], newest]))
                if i % 4 == 0:
                    aliases.append(dict(model_id=ids[name], name="recommended", updated_at=start,
                                        version_id=versions[ids[name], 1]))
            session.execute(Alias.__table__.insert(), aliases)
    return made
