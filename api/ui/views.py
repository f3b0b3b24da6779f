"""What the pages show, built from the JSON API's own queries and serializers (api/serialize.py,
registry_db/queries.py), so a page and `GET /v1/...` always agree."""

from __future__ import annotations

from ...registry_db.models import BundleVersion
from ...registry_db.ui_queries import extra_loss
from ...zoo.interop.convert import oscar_names
from ...zoo.manifest import Manifest
from ...zoo.recipes import sglang_recipe
from .. import serialize
from .render import plural

OUT = "rotations"
VARIANT_NOTES = {
    "bundle": "this bundle",
    "bundle-served": "this bundle as engines serve it (one K / V clip pair)",
    "oscar-shipped": "OSCAR as shipped (global clips, no key centering)",
    "hadamard": "Hadamard only (data-free)",
    "naive": "naive INT2 (no rotation)",
}
ORDER = tuple(VARIANT_NOTES)


def headline(v: BundleVersion | None) -> dict | None:
    """The at-a-glance summary of a model's recommended (else latest) version."""
    if v is None:
        return None
    # the same number the home page sorts by (ui_queries.sorted_models)
    return {**serialize.version_summary(v, []), "delta_nll": extra_loss(v.validation),
            "naive_delta_nll": extra_loss(v.validation, "naive")}


def other_versions(counts: dict[str, int]) -> str:
    """The versions besides the published ones: "1 draft, 2 yanked" ("" when none)."""
    parts = [plural(counts["draft"], "draft")] if counts.get("draft") else []
    parts += [f"{counts['yanked']} yanked"] if counts.get("yanked") else []
    return ", ".join(parts)


def kv_geometry(geometry: dict, shown: int | None = None) -> dict[str, str]:
    """KV heads and head dim as text, naming the layers that differ from the model-wide value
    (Gemma-4: head dim 512 on its full-attention layers), at most `shown` of them by id."""
    return {"kv_heads": per_layer(geometry["num_kv_heads"], geometry.get("kv_heads_by_layer"), shown),
            "head_dim": per_layer(geometry["head_dim"], geometry.get("head_dim_by_layer"), shown)}


def per_layer(default: int, by_layer: dict | None, shown: int | None = None) -> str:
    """256, or "256 (512 on 8 layers: 5, 11, 17, ...)" where some layers differ."""
    groups: dict[int, list[int]] = {}
    for layer, value in sorted((int(k), int(v)) for k, v in (by_layer or {}).items()):
        if value != default:
            groups.setdefault(value, []).append(layer)
    notes = []
    for value, layers in sorted(groups.items()):
        ids = ", ".join(map(str, layers[:shown])) + (", ..." if shown and len(layers) > shown else "")
        notes.append(f"{value} on {len(layers)} layer{'' if len(layers) == 1 else 's'}: {ids}")
    return f"{default} ({'; '.join(notes)})" if notes else str(default)


def validation_rows(validation: dict | None) -> list[dict]:
    """BF16 as the reference row, then the bundle and each baseline in a fixed order."""
    if not validation:
        return []
    variants = sorted(validation.get("variants", []),
                      key=lambda r: ORDER.index(r["name"]) if r["name"] in ORDER else len(ORDER))
    rows = [{"name": "bf16", "note": "BF16 KV cache (reference)", "delta_nll": 0.0, "kl": 0.0,
             "attn_rel_error": 0.0, "reference": True}]
    for r in variants:
        rows.append({**r, "note": VARIANT_NOTES.get(r["name"], r["name"]), "reference": False})
    return rows


def usage(detail: dict, endpoint: str) -> dict:
    """Copy-paste lines: point the client here, pull, and launch SGLang (zoo/recipes.py)."""
    name, number = detail["model"], detail["version"]
    manifest = Manifest.model_validate(detail["manifest"])
    k_name, v_name = oscar_names(manifest)
    recipe = sglang_recipe(manifest, f"{OUT}/{k_name}", f"{OUT}/{v_name}")
    return {"endpoint": f"export OSCAR_ZOO_ENDPOINT={endpoint}",
            "pull": f"oscar-zoo pull {name}@{number} --format sglang --out {OUT}/",
            "sglang": recipe.shell(), "notes": recipe.notes}


def version_view(v: BundleVersion, aliases: list[str], endpoint: str) -> dict:
    detail = serialize.version_detail(v, aliases)
    return {**detail, "summary": serialize.version_summary(v, aliases),
            "validation_rows": validation_rows(detail["validation"]),
            "usage": usage(detail, endpoint)}
