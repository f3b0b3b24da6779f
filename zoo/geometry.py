"""Attention geometry of a model: which layers keep a KV cache, and of what shape.

One dataclass, built from the catalog or from a model's `config.json` (or its live transformers
config); nothing else sniffs configs. Hybrid models (Qwen3.5: linear attention on 3 of every 4
layers) list only their full-attention layers, by *global* layer id, because that is how OSCAR
files key them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BundleFormatError, UnsupportedModelError


@dataclass(frozen=True)
class ModelGeometry:
    num_layers: int                      # decoder layers in the model
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    attention_layers: tuple[int, ...] = ()   # global ids of layers with a KV cache; () = all
    # Gemma-4 style models whose full-attention layers differ from the sliding ones.
    head_dim_by_layer: dict[int, int] = field(default_factory=dict)
    kv_heads_by_layer: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.num_kv_heads <= 0 or self.num_q_heads % self.num_kv_heads:
            raise BundleFormatError(
                f"q heads ({self.num_q_heads}) must be a positive multiple of kv heads "
                f"({self.num_kv_heads})")
        bad = [i for i in self.layers() if not 0 <= i < self.num_layers]
        if bad:
            raise BundleFormatError(f"attention layers {bad} outside 0..{self.num_layers - 1}")

    def layers(self) -> list[int]:
        return list(self.attention_layers) if self.attention_layers else list(range(self.num_layers))

    def head_dim_of(self, layer: int) -> int:
        return self.head_dim_by_layer.get(layer, self.head_dim)

    def kv_heads_of(self, layer: int) -> int:
        return self.kv_heads_by_layer.get(layer, self.num_kv_heads)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group)."""
        return self.num_q_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return {
            "num_layers": self.num_layers,
            "num_q_heads": self.num_q_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "attention_layers": list(self.attention_layers),
            "head_dim_by_layer": {str(k): v for k, v in self.head_dim_by_layer.items()},
            "kv_heads_by_layer": {str(k): v for k, v in self.kv_heads_by_layer.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ModelGeometry":
        return cls(
            num_layers=int(d["num_layers"]),
            num_q_heads=int(d["num_q_heads"]),
            num_kv_heads=int(d["num_kv_heads"]),
            head_dim=int(d["head_dim"]),
            attention_layers=tuple(int(i) for i in d.get("attention_layers") or ()),
            head_dim_by_layer={int(k): int(v) for k, v in (d.get("head_dim_by_layer") or {}).items()},
            kv_heads_by_layer={int(k): int(v) for k, v in (d.get("kv_heads_by_layer") or {}).items()},
        )


_LINEAR_KINDS = {"linear_attention", "mamba", "gated_deltanet"}

# What transformers' Gemma 4 text configs assume where config.json leaves out the keys that lay
# out and size their layers (Gemma4TextConfig / Gemma4UnifiedTextConfig.__post_init__): every
# 6th layer full where layer_types is missing, global_head_dim 512, and
# num_global_key_value_heads applies only with attention_k_eq_v, a field that defaults off.
_GEMMA4_TEXT = {"full_every": 6, "global_head_dim": 512, "attention_k_eq_v": False}
_FULL_LAYER_DEFAULTS = {"gemma4_text": _GEMMA4_TEXT, "gemma4_unified_text": _GEMMA4_TEXT}

# The text config class a multimodal config builds its text_config with: Gemma4Config and
# Gemma4UnifiedConfig's sub_configs_defaults name the class itself, so transformers reads no
# model_type from the text_config dict (SubConfigSpec.create_subconfig), and config.json
# files may leave it out.
_TEXT_TOWERS = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text", "gemma3n": "gemma3n_text"}

# Gemma 3n's config class fills layer_types in too where config.json has none (every 5th layer
# full, Gemma3nTextConfig.__init__), and leaves its last layer as given
_FILLED_KINDS = {"gemma3n_text": 5}


def geometry_from_config(config) -> ModelGeometry:
    """Geometry from a Hugging Face `config.json` dict or a live transformers config
    (multimodal configs: the text tower)."""
    cfg = text_tower(_as_dict(config))
    if cfg.get("kv_lora_rank"):
        raise UnsupportedModelError(
            "this model uses multi-head latent attention (MLA, kv_lora_rank set); OSCAR KV "
            "rotations cover standard GQA/MQA attention only. MLA latent rotations are not "
            "supported by oscar-zoo yet.")
    try:
        layers = int(cfg["num_hidden_layers"])
        q_heads = int(cfg["num_attention_heads"])
    except KeyError as e:
        raise BundleFormatError(f"config.json lacks {e.args[0]!r}; is this a causal LM config?") from None
    kv_heads = int(cfg.get("num_key_value_heads") or q_heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // q_heads)
    kinds = layer_kinds(cfg)
    attention = tuple(i for i, k in enumerate(kinds) if k not in _LINEAR_KINDS)
    if kinds and not attention:
        raise UnsupportedModelError("every layer is linear attention: there is no KV cache to rotate")
    if len(attention) == layers:
        attention = ()
    overrides = _layer_overrides(cfg, kinds)
    return ModelGeometry(layers, q_heads, kv_heads, head_dim, attention,
                         _differing(overrides, "head_dim", head_dim),
                         _differing(overrides, "num_key_value_heads", kv_heads))


def text_tower(config: dict) -> dict:
    """The text tower of a config.json dict: its text_config, under the model_type transformers
    builds it as, where it has one; else the dict itself."""
    text = config.get("text_config")
    if not text:
        return config
    tower = _TEXT_TOWERS.get(config.get("model_type"))
    return {**text, "model_type": tower} if tower else text


def layer_kinds(cfg: dict) -> list[str]:
    """A text tower's layer_types as its transformers config holds them ([] where it has none).

    Gemma 4's config classes fill them in where config.json has none, and make the last layer
    full attention whatever config.json says (Gemma4TextConfig.__post_init__: `if
    self.layer_types is None`, then `self.layer_types[-1] = "full_attention"`); Gemma 3n's fill
    them in only."""
    kinds = cfg.get("layer_types")
    defaults = _FULL_LAYER_DEFAULTS.get(cfg.get("model_type"))
    every = defaults["full_every"] if defaults else _FILLED_KINDS.get(cfg.get("model_type"))
    if kinds is None and every:
        kinds = ["sliding_attention" if (i + 1) % every else "full_attention"
                 for i in range(int(cfg["num_hidden_layers"]))]
    kinds = list(kinds or [])
    if defaults and kinds and kinds[-1] != "full_attention":    # an empty list stays empty
        kinds[-1] = "full_attention"
    return kinds


def _as_dict(config) -> dict:
    # A live transformers 5 config keeps Gemma 4's wider full layers in per_layer_config (and
    # raises on reading its global head_dim); to_dict() is the config.json that save_pretrained
    # writes, so both forms go through one reader.
    return config if isinstance(config, dict) else config.to_dict()


def _layer_overrides(cfg: dict, kinds: list[str]) -> dict[int, dict]:
    """Per layer, the attributes that transformers builds that layer with instead of the
    config's own: its per_layer_config where the config has one (what transformers 5 writes,
    keyed by zero-padded layer ids), else what Gemma 4's config class derives from the
    global_head_dim / num_global_key_value_heads its released config.json files carry."""
    if "per_layer_config" in cfg:   # transformers then ignores the global_* keys
        return {int(i): o for i, o in (cfg["per_layer_config"] or {}).items()}
    defaults = _FULL_LAYER_DEFAULTS.get(cfg.get("model_type"), {})
    full_dim = cfg.get("global_head_dim") or defaults.get("global_head_dim")
    if not full_dim:
        return {}
    full = {"head_dim": full_dim}
    full_kv = cfg.get("num_global_key_value_heads")
    # configs without the attention_k_eq_v field take the kv override unconditionally
    if full_kv and cfg.get("attention_k_eq_v", defaults.get("attention_k_eq_v", True)):
        full["num_key_value_heads"] = full_kv
    return {i: full for i, kind in enumerate(kinds) if kind == "full_attention"}


def _differing(overrides: dict[int, dict], key: str, default: int) -> dict[int, int]:
    # ModelGeometry lists only the layers that differ; per_layer_config may repeat the default
    return {i: int(o[key]) for i, o in sorted(overrides.items())
            if o.get(key) is not None and int(o[key]) != default}


def geometry_from_config_file(path: str | Path) -> ModelGeometry:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        return geometry_from_config(json.loads(path.read_text()))
    except FileNotFoundError:
        raise BundleFormatError(f"no config.json at {path}; pass a model directory or its config.json") from None
    except json.JSONDecodeError as e:
        raise BundleFormatError(f"{path} is not valid JSON: {e}") from None
