"""README.md model card for a bundle: YAML front matter (Hub conventions) plus a readable body.

Deterministic: it is rendered from the manifest alone, so the same manifest always gives the
same bytes and the bundle digest stays stable.
"""

from __future__ import annotations

import yaml

from .interop.convert import oscar_names
from .manifest import Manifest
from .recipes import lloyd_max_ignored, sglang_recipe


def front_matter(m: Manifest) -> dict:
    meta = {
        "library_name": "oscar-zoo",
        "license": "apache-2.0",
        "base_model": m.model.hub_id,
        "tags": ["oscar", "kv-cache", "int2", "kv-cache-quantization", "rotation"],
    }
    ours = {}
    if m.model.revision:
        # base_model takes a bare repo id on the Hub (an @revision there breaks its link), so
        # the revision the rotations were fitted to goes beside it
        ours["base_model_revision"] = m.model.revision
    if m.validation is not None:
        bundle = next((v for v in m.validation.variants if v.name == "bundle"), None)
        if bundle is not None:
            ours.update(validated=m.validation.passed, delta_nll=round(bundle.delta_nll, 4),
                        context_len=m.validation.context_len)
    if ours:
        meta["oscar_zoo"] = ours
    return meta


def base_model_line(m: Manifest) -> str:
    """Which revision of the base model the rotations were calibrated on, linked: rotations fit
    one set of weights, and a model repo's main branch may move on."""
    hub_id, rev = m.model.hub_id, m.model.revision
    if not rev:
        return (f"Calibrated on [{hub_id}](https://huggingface.co/{hub_id}); which revision "
                "was not recorded, so this card cannot say which weights they fit.")
    pinned = "" if _is_commit(rev) else (" (a branch or tag name, as asked for at calibration; "
                                        "its files may have changed since)")
    return (f"Calibrated on [{hub_id}](https://huggingface.co/{hub_id}/tree/{rev}) at revision "
            f"`{rev}`{pinned}.")


def _is_commit(rev: str) -> bool:
    return len(rev) == 40 and all(c in "0123456789abcdef" for c in rev.lower())


def render_card(m: Manifest) -> str:
    geo, q, c = m.geometry, m.quantization, m.clip
    layers = len(geo.attention_layers) or geo.num_layers
    lloyd = q.lloyd_max and lloyd_max_ignored(m) is None     # as SGLang serves it
    lines = [
        "---", yaml.safe_dump(front_matter(m), sort_keys=True).strip(), "---", "",
        f"# OSCAR INT2 KV-cache rotations for {m.model.hub_id}", "",
        "Orthogonal rotations and clip thresholds for serving this model with a 2-bit KV cache "
        "(OSCAR, arXiv 2605.17757). Made with [oscar-zoo](https://github.com/oscar-zoo/oscar-zoo).",
        "", base_model_line(m),
        "", "## Get it", "", "```bash", f"oscar-zoo pull {m.model.name} --format sglang", "```", "",
        "## What is inside", "",
        "| | |", "|---|---|",
        f"| layers with rotations | {layers} of {geo.num_layers} |",
        f"| heads | {geo.num_q_heads} query, {geo.num_kv_heads} KV, head_dim {geo.head_dim} |",
        f"| method | K `{m.method.k_objective}`, V `{m.method.v_objective}`, "
        f"composition `{m.method.compositions()}`, per {m.method.granularity} |",
        f"| key centering | {'on' if m.method.key_centering else 'off'} |",
        f"| clip ratios | K {c.k_global:g} / V {c.v_global:g} (granularity {c.granularity}"
        f"{', searched' if c.searched else ''}) |",
        f"| INT2 cache | group {q.group_size}, {q.scale_dtype} scale/zero, "
        f"BF16 sink {q.sink_tokens} + recent {q.recent_tokens}"
        f"{', Lloyd-Max buckets (SGLANG_LLOYD_MAX=1)' if lloyd else ''} |",
        f"| calibration | {m.calibration.source}, {m.calibration.tokens or '?'} tokens of "
        f"{m.calibration.dataset or 'unknown data'} |",
    ]
    if m.validation is not None:
        lines += _validation_section(m)
    k_name, v_name = oscar_names(m)     # what `pull --format sglang` writes into <dir>
    recipe = sglang_recipe(m, f"<dir>/{k_name}", f"<dir>/{v_name}")
    lines += ["", "## Serve with SGLang", "", "```bash", recipe.shell(), "```"]
    for note in recipe.notes:           # a blank line between: one paragraph each
        lines += ["", f"> {note}"]
    return "\n".join(lines) + "\n"


def _validation_section(m: Manifest) -> list[str]:
    v = m.validation
    out = ["", "## Validation", "",
           f"Extra next-token loss vs BF16 at context {v.context_len} (sink {v.sink_tokens}, "
           f"recent {v.recent_tokens}, group {v.group_size}"
           f"{', Lloyd-Max buckets' if v.quantizer == 'lloyd_max' else ''}, "
           f"{v.eval_tokens} tokens of {v.dataset}). "
           f"Result: **{'passed' if v.passed else 'failed'}** ({v.criterion}).", "",
           "| variant | extra loss (nats/token) | KL | attention rel. error |", "|---|---|---|---|"]
    for r in v.variants:
        out.append(f"| {r.name} | {r.delta_nll:+.4f} | {r.kl:.4f} | {r.attn_rel_error:.3f} |")
    return out
