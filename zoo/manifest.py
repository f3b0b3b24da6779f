"""`bundle.json`: the typed manifest of a rotation bundle.

Strict on purpose (huggingface_hub: "prefer strictness now, relax later"): unknown fields are
rejected, so a typo in a hand-edited manifest fails loudly instead of being ignored. Everything
an engine or a reviewer needs to use or trust the rotations is here, not in env vars or READMEs.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_serializer)

from .errors import BundleFormatError
from .geometry import ModelGeometry

FORMAT = "oscar-zoo.bundle"
FORMAT_VERSION = 1
MANIFEST = "bundle.json"
MAX_LAYERS, MAX_HEADS, MAX_HEAD_DIM = 100_000, 4096, 4096
TENSORS = "rotations.safetensors"
CARD = "README.md"

K_OBJECTIVES = ("qqt", "ktk", "hadamard", "identity", "imported")
V_OBJECTIVES = ("sst", "vtv", "hadamard", "identity", "imported")
COMPOSITIONS = ("plain", "pbr", "br", "r_h", "h_pbr", "h_r_pbr", "h_pbr_r", "r_h_pbr", "none")


def check_finite(value: Any, where: str = "value") -> Any:
    """`value` unchanged; raises ValueError naming the first NaN or Infinity inside it.

    Python's json reads and writes them, but they are not JSON (RFC 8259): a manifest or a
    job record holding one is unreadable to strict parsers and to the API's responses.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} is {value}: NaN and Infinity are not JSON; "
                         "use a finite number or null")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{where}[{i}]")
    return value


def layer_keys(by_layer: dict[str, Any]) -> dict[str, Any]:
    """`by_layer` unchanged; ValueError unless its keys are global layer ids (JSON keys are
    strings; ModelGeometry turns them into ints)."""
    bad = [k for k in by_layer if not k.isascii() or not k.isdigit()]
    if bad:
        raise ValueError(f"keys must be layer ids (0, 1, ...), not {bad[:3]}")
    if any(len(k) > len(str(MAX_LAYERS)) for k in by_layer):
        raise ValueError(f"layer ids must be below {MAX_LAYERS}")
    return by_layer


class Strict(BaseModel):
    # allow_inf_nan: float fields refuse NaN and Infinity (see check_finite for free-form ones)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelRef(Strict):
    name: str                       # catalog name, or the hub id's repo part for unknown models
    hub_id: str
    revision: str | None = None
    architecture: str | None = None


class Geometry(Strict):
    # bounds far above any model, so that a hostile manifest cannot make the checks that
    # expand it (a layer list, a [d, d] per layer) spend minutes and gigabytes before refusing
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    num_q_heads: int = Field(gt=0, le=MAX_HEADS)
    num_kv_heads: int = Field(gt=0, le=MAX_HEADS)
    head_dim: int = Field(gt=0, le=MAX_HEAD_DIM)
    attention_layers: list[int] = []
    head_dim_by_layer: dict[str, int] = {}
    kv_heads_by_layer: dict[str, int] = {}

    @field_validator("head_dim_by_layer", "kv_heads_by_layer")
    @classmethod
    def _by_layer(cls, by_layer: dict[str, int]) -> dict[str, int]:
        if any(not 0 < v <= max(MAX_HEADS, MAX_HEAD_DIM) for v in by_layer.values()):
            raise ValueError(f"values must be positive and at most {max(MAX_HEADS, MAX_HEAD_DIM)}")
        return layer_keys(by_layer)

    def to_geometry(self) -> ModelGeometry:
        return ModelGeometry.from_dict(self.model_dump())

    @classmethod
    def of(cls, g: ModelGeometry) -> "Geometry":
        return cls(**g.to_dict())


class Method(Strict):
    k_objective: Literal[K_OBJECTIVES]
    v_objective: Literal[V_OBJECTIVES]
    composition: Literal[COMPOSITIONS] = "r_h_pbr"
    # V's composition where it is not K's: a Hadamard V beside a fitted K, or an imported pair
    # of files made with different recipes. None: V has K's.
    v_composition: Literal[COMPOSITIONS] | None = None
    granularity: Literal["layer", "kv_head"] = "layer"
    key_centering: bool = False

    def composition_of(self, side: str) -> str:
        return self.v_composition or self.composition if side == "v" else self.composition

    def compositions(self) -> str:
        """For people: one name when both sides share it, else both."""
        if self.v_composition is None:
            return self.composition
        return f"K {self.composition} / V {self.v_composition}"


class Quantization(Strict):
    bits: Literal[2] = 2
    group_size: int = Field(gt=0)
    scale_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    sink_tokens: int = Field(default=64, ge=0)
    recent_tokens: int = Field(default=256, ge=0)
    lloyd_max: bool = False


class Clip(Strict):
    """Clip ratios (per-row |x| quantile, oscar-spec 2.9; 0 = off). Per-layer values are tensors."""

    granularity: Literal["global", "layer", "kv_head"] = "global"
    searched: bool = False
    k_global: float = Field(ge=0, le=1)   # the one pair for engines with a single setting
    v_global: float = Field(ge=0, le=1)
    k_min: float = Field(ge=0, le=1)
    k_median: float = Field(ge=0, le=1)
    k_max: float = Field(ge=0, le=1)
    v_min: float = Field(ge=0, le=1)
    v_median: float = Field(ge=0, le=1)
    v_max: float = Field(ge=0, le=1)


class Calibration(Strict):
    source: Literal["calibrated", "imported"] = "calibrated"
    dataset: str | None = None
    dataset_sha256: str | None = None
    tokens: int | None = None
    prompts: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    code_version: str
    torch_version: str | None = None
    transformers_version: str | None = None
    hardware: str | None = None
    created_at: str
    imported_from: str | None = None
    job_id: str | None = None
    spec: dict[str, Any] | None = None   # the declarative job spec, copied verbatim

    @field_validator("spec")
    @classmethod
    def _finite_spec(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_finite(spec, "spec")


class VariantResult(Strict):
    name: str                             # bundle | hadamard | naive | oscar-shipped
    delta_nll: float                      # nats/token above BF16
    kl: float                             # KL(BF16 || INT2) per token
    attn_rel_error: float                 # mean over layers of ||o - o_bf16|| / ||o_bf16||
    per_layer_attn_rel_error: list[float] = []
    delta_nll_by_set: list[float] = []    # one per disjoint evaluation set (noise estimate)


class Validation(Strict):
    passed: bool
    criterion: str
    tolerance: float
    dataset: str
    context_len: int
    eval_windows: int
    eval_tokens: int
    sink_tokens: int
    recent_tokens: int
    group_size: int
    scale_dtype: str
    bf16_nll: float
    bits_int2_tier: float                 # 2 + 2*scale_bits/group_size
    bits_at_context: float                # with the BF16 sink/recent windows at context_len
    # tokens each sliding-window (or chunked) layer keeps, by global layer id, where that is
    # fewer than context_len; every other layer holds the whole context (a KV-shared one:
    # nothing). Such a layer holds a higher share of BF16 tokens, which raises bits_at_context.
    # Needed whenever a window is below context_len, even one every layer shares (Mistral 7B
    # v0.1 past 4096): without it the report reads as a full cache's. Empty: every layer holds
    # the whole context (and in reports from before the field).
    # bits_at_context and these windows count the logical cache each layer's attention reads,
    # as transformers keeps it and validation's emulation reads it: a sliding layer's last W
    # positions, its sink positions gone from them once the window has slid past. A serving
    # pool that does not evict per window (oscar-spec 3.6: one flat slot pool) physically
    # holds more. Reports written before commit 08528e9 counted each sliding layer's sink
    # slots among its BF16 rows, so their bits_at_context reads a little higher.
    window_by_layer: dict[str, int] = {}
    variants: list[VariantResult]
    created_at: str
    code_version: str
    hardware: str | None = None
    int2_backend: str | None = None       # triton kernels, or their bit-exact vectorized twin
    quantizer: Literal["uniform", "lloyd_max"] = "uniform"   # the INT2 buckets simulated

    @field_validator("window_by_layer")
    @classmethod
    def _windows(cls, by_layer: dict[str, int]) -> dict[str, int]:
        if any(v <= 0 for v in by_layer.values()):
            raise ValueError("windows must be positive token counts")
        return layer_keys(by_layer)

    # written only where it is not empty: every other manifest keeps the bytes it had before
    # the field, so clients from before it (extra="forbid") still read it, and the canonical
    # bytes are the bundle's digest (a re-published bundle is matched to its version by it).
    # A model serializer, as a field serializer can change a value but not drop its key, and
    # Field(exclude_if=...) needs a newer pydantic than the 2.6 this project allows. No return
    # annotation on purpose: pydantic (2.6 to 2.14 at least) takes an annotated one as the
    # serialization JSON schema, and dict[str, Any] would hide every field from
    # model_json_schema(mode="serialization")
    @model_serializer(mode="wrap")
    def _without_empty_windows(self, handler):
        out = handler(self)
        if not out.get("window_by_layer"):
            out.pop("window_by_layer", None)
        return out


# --- the pass rule ---------------------------------------------------------------------------
# One rule for the verdict a report stores (calibrate/validate.py) and for the registry's check
# of an uploaded report (registry_db/publish.py): with two copies, a report could pass in one and
# fail in the other.

SERVED = "bundle-served"     # the bundle with the one clip pair an engine takes
BASELINES_JUDGED = ("hadamard", "naive")
# The criterion states naive_fraction with :g (6 significant digits), and Validation has no
# field for it: a check that reads it back allows that much rounding before it disagrees.
ROUNDING = 1e-6
_STATED_FRACTION = re.compile(r"<= (\S+) x naive INT2's")


_JUDGES_SERVED = f"as engines serve it ({SERVED})"


def criterion_text(tolerance: float, naive_fraction: float, served: bool) -> str:
    text = (f"extra loss <= Hadamard's + {tolerance:g} nats and <= "
            f"{naive_fraction:g} x naive INT2's")
    if served:
        text += f", for the bundle and {_JUDGES_SERVED}"
    return text


def judged_variants(by: dict[str, VariantResult]) -> list[str]:
    """The variants a verdict judges: the bundle, and where the report has it, the bundle as
    engines serve it (per-layer clips collapsed to one K / V pair): a user of SGLang or vLLM
    gets the second, so both must pass."""
    return ["bundle"] + ([SERVED] if SERVED in by else [])


def not_judged(by: dict[str, VariantResult]) -> str | None:
    """Why the variants cannot be judged, or None. A comparison that was not made fails the
    bundle: the stored verdict gates publishing, so it must never rest on one."""
    if "bundle" not in by:
        return "the report has no 'bundle' variant"
    missing = [b for b in BASELINES_JUDGED if b not in by]
    if missing:
        return f"the {' and '.join(missing)} baseline was not run"
    naive = by["naive"].delta_nll
    if naive <= 0:
        # no bound left: on a working model naive INT2 always costs loss (a cut or broken model,
        # or too little held-out text, is what makes it look free)
        return (f"naive INT2's extra loss is {naive:+.4f} nats, no worse than BF16, so the "
                "held-out text cannot tell good INT2 from bad; validate on a whole model with "
                "more --windows")
    return None


def loss_bound(by: dict[str, VariantResult], tolerance: float,
               naive_fraction: float | None) -> float:
    """The most extra loss a judged variant may have: Hadamard's + tolerance, and at most
    naive_fraction x naive INT2's (None: that half is not known, so not applied)."""
    bound = by["hadamard"].delta_nll + tolerance
    if naive_fraction is not None:
        bound = min(bound, naive_fraction * by["naive"].delta_nll)
    return bound


def verdict(by: dict[str, VariantResult], tolerance: float,
            naive_fraction: float) -> tuple[bool, str]:
    """(passed, the criterion as judged) for variants by name: every judged variant's extra
    loss <= min(Hadamard's + tolerance, naive_fraction x naive INT2's); a case that cannot be
    judged fails, and the criterion says why."""
    judged = judged_variants(by)
    criterion = criterion_text(tolerance, naive_fraction, len(judged) > 1)
    why = not_judged(by)
    if why:
        return False, f"{criterion}; not judged: {why}"
    bound = loss_bound(by, tolerance, naive_fraction)
    failed = [name for name in judged if by[name].delta_nll > bound]
    if failed and len(judged) > 1:
        criterion += f"; failed by {', '.join(failed)}"
    return not failed, criterion


def stated_naive_fraction(criterion: str) -> float | None:
    """The naive fraction a report was judged with, read back from its criterion (verdict
    writes it there; Validation stores the tolerance but not this), or None when the criterion
    does not state one in verdict's words."""
    match = _STATED_FRACTION.search(criterion)
    try:
        value = float(match.group(1)) if match else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def verdict_disagreement(report: Validation) -> str | None:
    """Why the report's `passed` contradicts its own numbers, or None.

    Judged by the rule its criterion states, as the rule has changed: its stored tolerance, its
    naive fraction as the criterion gives it (none: that half is not checked), bundle-served
    only where the criterion judged it ("as engines serve it"; earlier reports measured it
    without judging it), and a naive INT2 that costs nothing counted as unjudgeable only where
    the criterion says "not judged" (earlier ones applied the bound as it came). So a report
    `oscar-zoo validate` wrote in any version agrees with itself; an edited `passed` does not.
    Values within rounding of the bound are left as the report says."""
    by = {r.name: r for r in report.variants}
    missing = [n for n in ("bundle", *BASELINES_JUDGED) if n not in by]
    if missing:     # every version ran both baselines by default, and failed without them
        return (f"it says passed: true, but it cannot be judged: no {' or '.join(missing)} "
                "variant" if report.passed else None)
    fraction = stated_naive_fraction(report.criterion)
    bound = loss_bound(by, report.tolerance, fraction)
    slack = ROUNDING * max(1.0, abs(by["naive"].delta_nll))
    judged = ["bundle"] + ([SERVED] if SERVED in by and _JUDGES_SERVED in report.criterion else [])
    if report.passed:
        if not_judged(by) and "not judged" in report.criterion:
            return f"it says passed: true, but its criterion says {report.criterion!r}"
        over = [n for n in judged if by[n].delta_nll > bound + slack]
        if over:
            return (f"it says passed: true, but {_losses(by, over)} above the bound "
                    f"{_bound_text(by, report.tolerance, fraction, bound)}")
    elif (fraction is not None and "not judged" not in report.criterion
          and all(by[n].delta_nll < bound - slack for n in judged)):
        return (f"it says passed: false, but {_losses(by, judged)} within the bound "
                f"{_bound_text(by, report.tolerance, fraction, bound)}")
    return None


def _losses(by: dict[str, VariantResult], names: list[str]) -> str:
    listed = " and ".join(f"{n}'s extra loss {by[n].delta_nll:+.4f}" for n in names)
    return listed + (" is" if len(names) == 1 else " are")


def _bound_text(by: dict[str, VariantResult], tolerance: float, fraction: float | None,
                bound: float) -> str:
    parts = f"hadamard {by['hadamard'].delta_nll:+.4f} + tolerance {tolerance:g}"
    if fraction is not None:
        parts += f"; {fraction:g} x naive {by['naive'].delta_nll:+.4f}"
    return f"{bound:+.4f} nats/token ({parts})"


class FileEntry(Strict):
    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Manifest(Strict):
    format: Literal[FORMAT] = FORMAT
    format_version: Literal[FORMAT_VERSION] = FORMAT_VERSION
    model: ModelRef
    geometry: Geometry
    method: Method
    quantization: Quantization
    clip: Clip
    calibration: Calibration
    validation: Validation | None = None
    files: list[FileEntry] = []

    @field_validator("files")
    @classmethod
    def _unique_files(cls, files: list[FileEntry]) -> list[FileEntry]:
        names = [f.name for f in files]
        if len(names) != len(set(names)):
            raise ValueError("duplicate file names")
        if MANIFEST in names:   # it would stand in for the manifest whose hash was checked
            raise ValueError(f"{MANIFEST} lists itself")
        return files

    def file(self, name: str) -> FileEntry:
        for f in self.files:
            if f.name == name:
                return f
        raise BundleFormatError(f"manifest lists no file {name!r}")

    def to_json(self) -> str:
        """Canonical serialization: the bytes hashed into the bundle's digest."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def parse_manifest(text: str | bytes, where: str = MANIFEST) -> Manifest:
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(root)'}: {err['msg']}"
                             for err in e.errors()[:5])
        raise BundleFormatError(f"{where} is not a valid oscar-zoo manifest: {problems}") from None


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
