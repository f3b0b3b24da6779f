"""Attention geometry of a model: which layers keep a KV cache, and of what shape.

One dataclass, built from the catalog or from a model's `config.json`; nothing else sniffs
configs. Hybrid models (Qwen3.5: linear attention on 3 of every 4 layers) list only their
full-attention layers, by *global* layer id, because that is how OSCAR files key them.
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


def geometry_from_config(config: dict) -> ModelGeometry:
    """Geometry from a Hugging Face `config.json` dict (multimodal configs: the text tower)."""
    cfg = config.get("text_config") or config
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
    kinds = list(cfg.get("layer_types") or [])
    attention = tuple(i for i, k in enumerate(kinds) if k not in _LINEAR_KINDS)
    if kinds and not attention:
        raise UnsupportedModelError("every layer is linear attention: there is no KV cache to rotate")
    if len(attention) == layers:
        attention = ()
    head_dims, kv_by_layer = {}, {}
    full_dim, full_kv = cfg.get("global_head_dim"), cfg.get("num_global_key_value_heads")
    for i, kind in enumerate(kinds):
        if kind == "full_attention" and full_dim and int(full_dim) != head_dim:
            head_dims[i] = int(full_dim)
        if kind == "full_attention" and full_kv and int(full_kv) != kv_heads:
            kv_by_layer[i] = int(full_kv)
    return ModelGeometry(layers, q_heads, kv_heads, head_dim, attention, head_dims, kv_by_layer)


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
