"""Exact serving recipes for a bundle: the env vars and flags an engine needs (oscar-spec 1.8, 3, 4.4).

Used by `pull`, the model card and the web UI, so all three print the same thing. Functions take
the manifest as a `Manifest` or as the plain dict of bundle.json (the warm `pull` path reads the
JSON without pydantic).

Sources of the names:
- SGLang: FutureMLS-Lab/OSCAR@473ff3f README "Serving with the rotation" and
  sglang-research/python/sglang/srt/environ.py (SGLANG_OSCAR_*, SGLANG_MIXED_KV_*), and
  sgl-project/sglang#32129 (`--kv-cache-dtype int2`, `--kv-cache-quant-group-size`).
- vLLM: the open PR vllm-project/vllm#46774 (`--kv-cache-dtype oscar_int2`); its env knobs as read
  at justzhanghong/vllm@79b359b vllm/model_executor/layers/quantization/oscar/config.py
  (VLLM_OSCAR_{K,V}_ROTATION_PATH, _{K,V}_CLIP_RATIO, _GROUP_SIZE, _PREFIX_TOKENS,
  _RECENT_TOKENS). The PR is WIP: names may still change.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

VLLM_PR = "vllm-project/vllm#46774"

# Architectures whose SGLang model code folds R_v into the V slice of qkv_proj when
# SGLANG_OSCAR_ABSORB_V_ROTATION=1 (oscar-spec 4.4: qwen3.py, glm4_moe.py with dense or
# per-channel FP8 weights; the hybrid branch's qwen3_5.py, dense weights). Elsewhere the flag is
# at best a no-op and at worst a refusal to start: block-FP8 weights (MiniMax-M2.7) are
# rejected, and OSCAR serves that model with 0. 0 is always correct, only slower.
_ABSORBS_V = frozenset({"Qwen3ForCausalLM", "Glm4MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
                        "Qwen3_5MoeForConditionalGeneration"})


@dataclass(frozen=True)
class Recipe:
    engine: str
    env: dict[str, str]
    command: list[str]
    notes: list[str]

    def shell(self) -> str:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()]
        # The program on the first line, then one flag and its value per line.
        parts: list[str] = []
        for w in (shlex.quote(c) for c in self.command):
            if parts and not w.startswith("--"):
                parts[-1] += f" {w}"
            else:
                parts.append(w)
        lines.append(" \\\n  ".join(parts))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "env": self.env, "command": self.command, "notes": self.notes}


def _as_dict(m: Any) -> dict:
    return m.model_dump(mode="json") if hasattr(m, "model_dump") else m


def _entry(m: dict):
    from .catalog import find

    return find(m["model"]["name"]) or find(m["model"]["hub_id"])


def _gpus(m: dict) -> int:
    """GPUs OSCAR's own recipe uses for this model (tensor parallel), from the catalog."""
    entry = _entry(m)
    return entry.gpus if entry is not None else 1


def _layer_note(m: dict, layers: list[int] | None) -> list[str]:
    from .export import layers_arg

    geo = m["geometry"]
    if not layers or layers == (geo.get("attention_layers") or list(range(geo["num_layers"]))):
        return []
    word = "layer" if len(layers) == 1 else "layers"
    return [f"These files hold {word} {layers_arg(layers)} only ({len(layers)} {word}, by "
            "global id): one pipeline stage's share. The loaders look layers up by global id, so "
            "give each stage the files with its own layers."]


def _lloyd_note(report: dict | None) -> str:
    """What SGLANG_LLOYD_MAX=1 serves beside what this bundle's validation report measured (its
    `quantizer`; a report from before that field measured uniform INT2)."""
    served = ("SGLANG_LLOYD_MAX=1 is how OSCAR serves this model: Lloyd-Max buckets when a "
              "prefill is quantized, uniform INT2 for decoded tokens (oscar-spec 5).")
    if report is None:
        return served + " This bundle has no validation report."
    if report.get("quantizer") == "lloyd_max":
        return (served + " oscar-zoo's validation simulated Lloyd-Max buckets for every INT2 "
                "token, while SGLang buckets prefill tokens so and quantizes decoded tokens "
                "uniform. Dropping the variable serves uniform INT2, which this bundle was not "
                "validated with.")
    return (served + " This bundle's validation report measured uniform INT2; drop the variable "
            "to serve what it measured.")


def lloyd_max_ignored(m) -> str | None:
    """Why SGLang ignores SGLANG_LLOYD_MAX=1 for this bundle, or None (lloyd_max_ignored_for)."""
    m = _as_dict(m)
    q, clip, geo = m["quantization"], m["clip"], m["geometry"]
    dims = [geo["head_dim"], *(geo.get("head_dim_by_layer") or {}).values()]
    return lloyd_max_ignored_for(q["group_size"], dims, clip["k_global"], clip["v_global"])


def lloyd_max_ignored_for(group_size: int, head_dims, k_clip: float, v_clip: float) -> str | None:
    """Why SGLang ignores SGLANG_LLOYD_MAX=1 for a cache of these settings, or None: it applies
    it only in its single-scale clip kernel (oscar-spec 5), so not with groups below every
    head_dim, nor with both clip ratios off. The one statement of the rule: the recipe, the
    model card and validation's quantizer (calibrate/int2_attention.py) all ask it."""
    low = min(head_dims)
    if group_size < low:
        return (f"its group size {group_size} is below head_dim {low}, so SGLang's grouped "
                "kernel quantizes it")
    if k_clip <= 0 and v_clip <= 0:
        return "both clip ratios are 0, so SGLang's kernel without clip quantizes it"
    return None


def _absorbs_v(m: dict) -> bool:
    """Whether SGLang may fold R_v into the weights: one rotation per layer (folding is invalid
    per KV head, oscar-spec 1.3) and model code that supports these weights."""
    if m["method"]["granularity"] == "kv_head":
        return False
    entry = None if m["model"].get("architecture") else _entry(m)
    return (m["model"].get("architecture") or getattr(entry, "architecture", None)) in _ABSORBS_V


def _clip_note(clip: dict, engine: str) -> list[str]:
    if clip["granularity"] == "global":
        return []
    return [f"This bundle's clip ratios were searched per {clip['granularity']}; {engine} takes "
            f"one K and one V ratio, so the best single pair ({clip['k_global']:g}/"
            f"{clip['v_global']:g}) is set. oscar-zoo's own kernels use the per-layer values."]


def sglang_recipe(m, k_path: str, v_path: str, layers: list[int] | None = None) -> Recipe:
    m = _as_dict(m)
    q, clip, method = m["quantization"], m["clip"], m["method"]
    per_head = method["granularity"] == "kv_head"
    env = {
        # Without it SGLang builds no BF16 sink/recent tiers and reads neither window below:
        # the whole cache goes INT2 (EnvBool(False) in environ.py; OSCAR's README sets it).
        "SGLANG_ENABLE_MIXED_KV_WINDOWS": "1",
        "SGLANG_OSCAR_K_ROTATION_PATH": k_path,
        "SGLANG_OSCAR_V_ROTATION_PATH": v_path,
        "SGLANG_OSCAR_K_CLIP_RATIO": f"{clip['k_global']:g}",
        "SGLANG_OSCAR_V_CLIP_RATIO": f"{clip['v_global']:g}",
        "SGLANG_MIXED_KV_PREFIX_TOKENS": str(q["sink_tokens"]),
        "SGLANG_MIXED_KV_RECENT_TOKENS": str(q["recent_tokens"]),
        "SGLANG_MIXED_KV_SCALE_DTYPE": q["scale_dtype"],
    }
    env["SGLANG_OSCAR_ABSORB_V_ROTATION"] = "1" if _absorbs_v(m) else "0"
    lloyd = []
    if q.get("lloyd_max"):
        why = lloyd_max_ignored(m)
        if why:
            lloyd = [f"OSCAR serves this model with SGLANG_LLOYD_MAX=1, which SGLang applies only "
                     f"in its single-scale clip kernel (oscar-spec 5); this bundle is served "
                     f"uniform INT2 whatever the variable says, as {why}. So it is left unset."]
        else:
            env["SGLANG_LLOYD_MAX"] = "1"
            lloyd = [_lloyd_note(m.get("validation"))]
    command = ["python", "-m", "sglang.launch_server", "--model-path", m["model"]["hub_id"],
               "--kv-cache-dtype", "int2", "--kv-cache-quant-group-size", str(q["group_size"]),
               "--prefill-attention-backend", "fa3", "--decode-attention-backend", "triton"]
    gpus = _gpus(m)
    if gpus > 1:
        command += ["--tp-size", str(gpus)]
    notes = []
    if m["geometry"].get("attention_layers"):
        # INT2 forces --page-size 8; a hybrid model's MambaRadixCache asserts page size 1 and
        # it surfaces as an illegal memory access (oscar-spec 7.5).
        command.append("--disable-radix-cache")
        notes.append("Hybrid model: --disable-radix-cache, because INT2 pages hold 8 tokens and "
                     "SGLang's MambaRadixCache wants 1. An SGLang with --mamba-scheduler-strategy "
                     "extra_buffer can keep the prefix cache instead.")
    notes += _clip_note(clip, "SGLang")
    if method.get("key_centering"):
        notes.append("The K file carries OSCAR format 3's k_mean (key centering); it needs an "
                     "OSCAR-2-aware loader (load_oscar_rotation_field). Older loaders ignore it.")
    if per_head:
        notes.append("Per-KV-head rotations (OSCAR format 2): needs an SGLang build whose loader "
                     "dispatches on rotation.dim() (FutureMLS-Lab/OSCAR#20).")
    notes += _page_note(q["sink_tokens"], q["recent_tokens"])
    return Recipe("sglang", env, command, notes + lloyd + _layer_note(m, layers))


# SGLang's INT2 page: 4 x the BF16 tier's itemsize slots (oscar-spec 3.6)
PAGE_TOKENS = 8


def _page_note(sink: int, recent: int) -> list[str]:
    """SGLang's pool asserts that both BF16 windows are whole INT2 pages (oscar-spec 3.5): a
    bundle validated with other windows gets a server that refuses to start with these values."""
    odd = [f"{name} {n}" for name, n in (("sink", sink), ("recent", recent)) if n % PAGE_TOKENS]
    if not odd:
        return []
    fit = ", ".join(f"{name} {n // PAGE_TOKENS * PAGE_TOKENS or PAGE_TOKENS}" for name, n in
                    (("sink", sink), ("recent", recent)))
    return [f"SGLang needs both BF16 windows to be multiples of its {PAGE_TOKENS}-token INT2 page, "
            f"and this bundle was validated with {' and '.join(odd)}: the server refuses to start "
            f"with these values. Launch with windows that are (e.g. {fit}; quality then differs "
            "from the bundle's report), or calibrate with such windows."]


def vllm_recipe(m, k_path: str, v_path: str, layers: list[int] | None = None) -> Recipe:
    m = _as_dict(m)
    q, clip = m["quantization"], m["clip"]
    env = {
        "VLLM_OSCAR_K_ROTATION_PATH": k_path,
        "VLLM_OSCAR_V_ROTATION_PATH": v_path,
        "VLLM_OSCAR_K_CLIP_RATIO": f"{clip['k_global']:g}",
        "VLLM_OSCAR_V_CLIP_RATIO": f"{clip['v_global']:g}",
        "VLLM_OSCAR_GROUP_SIZE": str(q["group_size"]),
        "VLLM_OSCAR_PREFIX_TOKENS": str(q["sink_tokens"]),
        "VLLM_OSCAR_RECENT_TOKENS": str(q["recent_tokens"]),
    }
    command = ["vllm", "serve", m["model"]["hub_id"], "--kv-cache-dtype", "oscar_int2"]
    gpus = _gpus(m)
    if gpus > 1:
        command += ["--tensor-parallel-size", str(gpus)]
    notes = [f"vLLM's OSCAR backend is an open, work-in-progress PR ({VLLM_PR}); these variable "
             "names are the PR branch's and may change before it merges."]
    notes += _clip_note(clip, "vLLM")
    # The PR's loader (oscar/rotation.py) reads each layer's `rotation` and nothing else, and
    # its quantizer is uniform only: what the SGLang recipe turns on has no switch here.
    if m["method"].get("key_centering"):
        notes.append("This bundle centers keys (k_mean in the K file), which vLLM's OSCAR loader "
                     "ignores: keys are quantized uncentered. Attention stays exact, but the INT2 "
                     "error is not the one this bundle was fitted and validated with; "
                     "--format sglang with an OSCAR-2-aware loader applies it.")
    if q.get("lloyd_max"):
        notes.append("OSCAR serves this model with Lloyd-Max INT2 buckets (SGLANG_LLOYD_MAX=1); "
                     "vLLM's port quantizes uniform INT2 only.")
    limits = []
    if m["geometry"]["head_dim"] != 128 or q["group_size"] != 128:
        limits.append("head_dim 128 with group size 128")
    if (round(clip["k_global"], 6), round(clip["v_global"], 6)) != (0.96, 0.92):
        limits.append("clip ratios 0.96/0.92")
    if q["sink_tokens"] != 64 or q["recent_tokens"] % 16:
        limits.append("64 sink tokens and a recent window that is a multiple of 16")
    if limits:
        notes.append("The PR's prototype checks its settings and accepts only "
                     + "; ".join(limits) + " so far; this bundle differs, so expect it to refuse "
                     "to start until the PR generalizes.")
    return Recipe("vllm", env, command, notes + _layer_note(m, layers))


def recipe_for(fmt: str, m, files: dict[str, str], layers: list[int] | None = None) -> Recipe | None:
    """The launch recipe for an export: files maps "k" and "v" to the exported .pt paths."""
    if fmt == "sglang":
        return sglang_recipe(m, files["k"], files["v"], layers)
    if fmt == "vllm":
        return vllm_recipe(m, files["k"], files["v"], layers)
    return None
