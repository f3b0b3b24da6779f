"""The declarative calibration job spec: what `POST /v1/jobs` accepts, what a worker runs, and
what is copied verbatim into the bundle (`calibration.spec`).

No torch here: the API checks a spec at submit time, the CLI builds one. `complete()` fills
every default from the catalog, so the stored spec says exactly what ran.

    {"model": "smollm2-135m", "tokens": 8192, "seq_len": 2048,
     "validation": {"context_len": 2048, "windows": 2}, "aliases": ["recommended"]}

`model` is a catalog name, a hub id (org/name, loaded by the workers from the hub), or an
absolute path the workers can read (a model directory or a .gguf file); a path needs
`publish_as` unless it is a catalog model's. `data` entries are `builtin:pydoc`, a .txt/.jsonl
path, or `hf:ORG/NAME[:CONFIG][@SPLIT]` (see calibrate/data.py).

A model only the registry knows (someone uploaded its bundles: no catalog name, no hub id) may
be named too, as `model` or `publish_as`: submit, which has the registry, writes it into the
stored spec as the workers need it (api/routes/jobs.py), since they have no registry to ask:
`publish_as` its registry name, `publish_hub_id` its hub id, and `model` (when named there) its
hub id, which they load.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oscar_zoo.zoo import catalog, settings
from oscar_zoo.zoo.errors import Forbidden, InvalidInput, ModelNotFound
from oscar_zoo.zoo.geometry import ModelGeometry

from .data import Terms

BUILTIN_DATA = "builtin:pydoc"
_MIRROR = re.compile(r"(hf|modelscope):[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class Strict(BaseModel):
    # NaN or Infinity in a stored spec would make every read of its job answer 500 (not JSON)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ValidationSpec(Strict):
    enabled: bool = True
    data: list[str] = Field(default_factory=lambda: [BUILTIN_DATA], max_length=16)
    context_len: int = Field(2048, ge=16, le=1 << 20)
    windows: int = Field(6, ge=1, le=256)
    tolerance: float = Field(0.05, ge=0)
    require_pass: bool = Field(True, description="publish only a bundle that passes; "
                               "otherwise it is kept as a draft with its report")


MAX_SEED = 2**63 - 1   # torch.Generator.manual_seed's limit (a signed 64-bit integer)


class JobSpec(Strict):
    model: str = Field(min_length=1, max_length=500)
    revision: str | None = Field(None, max_length=200)
    publish_as: str | None = Field(None, max_length=200,
                                   description="catalog name, hub id, or registry model name to "
                                               "publish under")
    publish_hub_id: str | None = Field(None, max_length=200,
                                       description="hub id of a publish_as only the registry "
                                                   "knows; filled in at submit")
    data: list[str] = Field(default_factory=lambda: [BUILTIN_DATA], min_length=1, max_length=16)
    text_field: str = Field("text", max_length=100)
    tokens: int | None = Field(None, ge=1, le=1 << 30)
    seq_len: int | None = Field(None, ge=2, le=1 << 20)
    batch_size: int | None = Field(None, ge=1, le=1024)   # None: automatic (pipeline.windows_per_forward)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    k_objective: Literal["qqt", "ktk", "hadamard"] = "qqt"
    v_objective: Literal["sst", "vtv", "hadamard"] = "sst"
    composition: Literal["r_h_pbr", "r_h", "pbr", "plain"] = "r_h_pbr"
    granularity: Literal["layer", "kv_head"] = "layer"
    key_centering: bool = True
    clip_search: bool = True
    clip_per_head: bool = False
    clip_windows: int = Field(2, ge=1, le=64)
    clip_queries: int = Field(256, ge=1, le=65536)
    k_clip: float = Field(0.96, ge=0, le=1)
    v_clip: float = Field(0.92, ge=0, le=1)
    group_size: int | None = Field(None, ge=1, le=4096)
    scale_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    sink_tokens: int | None = Field(None, ge=0, le=1 << 20)
    recent_tokens: int | None = Field(None, ge=0, le=1 << 20)
    # Lloyd-Max INT2 buckets (SGLANG_LLOYD_MAX=1, oscar-spec 5) in clip search and validation,
    # recorded in the manifest; needs group_size == head_dim. None: the catalog's.
    lloyd_max: bool | None = None
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    publish: bool = True
    aliases: list[str] = Field(default_factory=list, max_length=16)
    mirror: list[str] = Field(default_factory=list, max_length=8)
    gpus: int | None = Field(None, ge=1, le=64, description="default: the catalog's, else 1")
    ray_resources: dict[str, float] = Field(default_factory=dict, max_length=8,
                                            description="custom Ray resources the task needs")
    lease_seconds: float | None = Field(None, ge=1, le=3600)
    max_attempts: int | None = Field(None, ge=1, le=20)


# The spec's fields as the data loader's errors name them (data.load_text(..., terms=...)):
# a job's owner changes these, not the CLI options the loader names by default. As
# check_clip_windows is told the CLI's names, the loader is told these.
DATA_TERMS = Terms(data="data", held_out_data="validation.data", text_field="text_field",
                   tokens="tokens", seq_len="seq_len", clip_windows="clip_windows",
                   no_clip_search="clip_search false", where=" in the job spec",
                   more_text="add text to data")


# What jobspec's refusals tell a job's owner to change, in the spec's fields (as the API takes
# them). `oscar-zoo jobs submit` gets a refusal as the registry's text and says these in its
# options' words (zoo/cli/jobs_cmds.py), so each is spelled once, here.
CONTEXT_LEN = "validation.context_len"
WINDOWS_FROM = "the job spec's sink_tokens and recent_tokens"
CLIP_SEARCH_OFF = "set clip_search false"
CLIP_SEARCH_ON = "turn clip_search on"
DRAFT = "publish false"
PUBLISH_ON = "set publish true (or leave it out)"
NO_ALIASES = "leave aliases out"


def parse_spec(body: dict) -> JobSpec:
    """Raises InvalidInput naming the first bad fields."""
    try:
        return JobSpec.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(spec)'}: {err['msg']}"
                             for err in e.errors()[:5])
        raise InvalidInput(f"invalid job spec: {problems}") from None


def is_path(model: str) -> bool:
    return model.startswith(("/", "~", "./", "../")) or model.endswith(".gguf")


def identity(spec: JobSpec) -> tuple[str, str, catalog.CatalogEntry | None]:
    """(registry name, hub id, catalog entry) the bundle is published under.

    Raises ModelNotFound (with suggestions) for a bare name nobody knows, InvalidInput for a
    path without `publish_as`. Needs no registry: a registry-only `publish_as` comes with the
    `publish_hub_id` submit found for it.
    """
    named = spec.publish_as or spec.model
    if spec.publish_as is None and is_path(spec.model):
        entry = _entry_for_path(spec.model)
        if entry is None:
            raise InvalidInput(f"model {spec.model!r} is a path: say which model it is with "
                               "publish_as (a catalog name, a hub id like org/name, or a model "
                               "the registry holds)")
        return entry.name, entry.hub_id, entry
    found = named_identity(named)
    if found is not None:
        return found
    if spec.publish_as is not None and spec.publish_hub_id is not None:
        return spec.publish_as, spec.publish_hub_id, None
    raise ModelNotFound(f"unknown model {named!r}: use a catalog name, a hub id (org/name) or "
                        "an absolute path the workers can read.", suggestions=catalog.suggest(named))


def named_identity(named: str) -> tuple[str, str, catalog.CatalogEntry | None] | None:
    """identity() of a catalog name or a hub id (a job's bundle goes under the catalog's name,
    or the hub id's repo part lowercased); None for anything else."""
    entry = catalog.find(named)
    if entry is not None:
        return entry.name, entry.hub_id, entry
    if catalog.is_hub_id(named):
        return named.split("/")[-1].lower(), named, None
    return None


def _entry_for_path(model: str) -> catalog.CatalogEntry | None:
    from .loading import BUILTIN_GGUF   # no torch at import

    path = Path(model)
    for name, (_, filename) in BUILTIN_GGUF.items():
        if path.name == filename:
            return catalog.find(name)
    return catalog.find(path.name) if not path.suffix else None


def complete(spec: JobSpec, entry: catalog.CatalogEntry | None) -> JobSpec:
    """Every default filled in (from the catalog entry where it has one), model normalized."""
    upd: dict = {}
    if entry is not None and not is_path(spec.model) and spec.publish_as is None:
        upd["model"] = entry.name
    defaults = dict(tokens=settings.get("calib_tokens"), seq_len=settings.get("calib_seq_len"),
                    gpus=entry.gpus if entry else 1,
                    lease_seconds=float(settings.get("job_lease_seconds")),
                    max_attempts=settings.get("job_max_attempts"), **int2_defaults(entry))
    for key, value in defaults.items():
        if getattr(spec, key) is None:
            upd[key] = value
    return spec.model_copy(update=upd)


def int2_defaults(entry: catalog.CatalogEntry | None) -> dict:
    """The INT2 cache a model is served with (OSCAR's shipped settings for it): what clip search
    and validation must simulate. For a job spec and for `oscar-zoo calibrate` alike."""
    if entry is None:
        return {"sink_tokens": 64, "recent_tokens": 256, "lloyd_max": False}
    return {"sink_tokens": entry.sink_tokens, "recent_tokens": entry.recent_tokens,
            "group_size": min(entry.group_size, entry.geometry.head_dim),
            "lloyd_max": entry.lloyd_max}


def check_windows(sink: int, recent: int, seq_len: int | None = None,
                  context_len: int | None = None, *, job_spec: bool = False) -> None:
    """InvalidInput when clip search's windows (seq_len) or validation's (context_len) hold no
    token past the BF16 sink + recent tiers: each would run a whole model pass and then fail or
    measure nothing. For a job spec (`job_spec`: said in its fields alone), a CalibrationConfig
    and a CLI validation (`oscar-zoo calibrate` checks its windows with check_clip_windows
    first, in its options' names)."""
    if sink < 0 or recent < 0:
        raise InvalidInput(f"sink_tokens {sink} and recent_tokens {recent} must be >= 0")
    if seq_len is not None:
        check_clip_windows(seq_len, sink, recent)
    window = sink + recent
    if context_len is not None and context_len <= window:
        fix = (CONTEXT_LEN if job_spec
               else f"--context-len ({CONTEXT_LEN} in a job spec)")
        raise InvalidInput(f"{CONTEXT_LEN} {context_len} must exceed sink {sink} + recent "
                           f"{recent} = {window}; raise {fix} above {window}")


def check_clip_windows(seq_len: int, sink: int, recent: int, *, seq_len_name: str = "seq_len",
                       windows_from: str = f"{WINDOWS_FROM}; by default how OSCAR serves "
                                           "the model",
                       clip_search_off: str = f"{CLIP_SEARCH_OFF} to use the fixed k_clip / "
                                              "v_clip instead (OSCAR ships 0.96 / 0.92)") -> None:
    """InvalidInput when the clip search's windows of seq_len tokens hold no token past the BF16
    sink + recent tiers: the search would run a whole model pass and measure nothing.

    The message names what to change as the caller knows it: a job spec's fields (a
    CalibrationConfig's are the same) unless told; `oscar-zoo calibrate` names its options, and
    where its windows come from (how OSCAR serves the model: not an option of the command)."""
    window = sink + recent
    if seq_len > window:
        return
    example = " (e.g. 2048)" if window < 2048 else ""   # the default seq_len, where it is enough
    raise InvalidInput(
        f"{seq_len_name} {seq_len} leaves no INT2 keys for the clip search: its windows must be "
        f"longer than the BF16 sink {sink} + recent {recent} = {window} tokens ({windows_from}). "
        f"Raise {seq_len_name} above {window}{example}, or {clip_search_off}")


def check(spec: JobSpec, geometry: ModelGeometry | None) -> None:
    """Reject what cannot run, before it is queued. Raises InvalidInput saying what to change."""
    check_windows(spec.sink_tokens, spec.recent_tokens,
                  seq_len=spec.seq_len if spec.clip_search else None,
                  context_len=spec.validation.context_len if spec.validation.enabled else None,
                  job_spec=True)
    _check_aliases(spec)
    for target in spec.mirror:
        if not _MIRROR.fullmatch(target):
            raise InvalidInput(f"mirror target {target!r}: use hf:ORG/REPO or modelscope:ORG/REPO")
    _check_ray_resources(spec.ray_resources)
    check_paths(spec)
    shared = [d for d in spec.validation.data if d in spec.data and d != BUILTIN_DATA]
    if spec.validation.enabled and shared:   # else refused by validate() only after calibrating
        raise InvalidInput(f"validation.data {shared} is also calibration data: validation would "
                           f"score the bundle on the text it was fitted to; use other text (default "
                           f"{BUILTIN_DATA}, whose held-out half calibration never reads)")
    if spec.lloyd_max and not spec.clip_search and spec.k_clip <= 0 and spec.v_clip <= 0:
        # SGLang runs the kernel that applies SGLANG_LLOYD_MAX only when a clip ratio is on
        raise InvalidInput("lloyd_max needs a clip: OSCAR's Lloyd-Max path (SGLANG_LLOYD_MAX=1) "
                           "is its single-scale clip kernel, which SGLang runs only when the K or "
                           "V clip ratio is above 0; with k_clip and v_clip 0 the bundle would be "
                           f"served uniform INT2. Set a clip ratio above 0, {CLIP_SEARCH_ON}, "
                           "or set lloyd_max false (\"lloyd_max\": false in the job spec) to "
                           "calibrate for uniform INT2")
    if geometry is not None:
        _check_geometry(spec, geometry)


def _check_aliases(spec: JobSpec) -> None:
    """The registry's alias rule, in its words (`oscar-zoo alias` says the same), and no alias
    for a draft: record_result moves a job's aliases only with a published version, and promote
    moves none, so they would silently never move."""
    for alias in spec.aliases:
        if not catalog.ALIAS_NAME.fullmatch(alias):
            raise InvalidInput(f"alias {alias!r} is not valid: {catalog.ALIAS_RULE}")
        if alias == "latest":
            raise InvalidInput("alias 'latest' always points at the newest published version and "
                               "moves by itself: leave it out; use recommended or your own alias "
                               "to pin a version")
    if spec.aliases and not spec.publish:
        name = identity(spec)[0]
        shown = ("alias " if len(spec.aliases) == 1 else "aliases ") + ", ".join(spec.aliases)
        raise InvalidInput(f"{shown} would never move: aliases move only with a published "
                           f"version, and {DRAFT} keeps this job's version a draft; "
                           f"{PUBLISH_ON}, or {NO_ALIASES} and run `oscar-zoo alias {name}@N "
                           f"{spec.aliases[0]}` after `oscar-zoo promote {name}@N`")


def check_paths(spec: JobSpec) -> None:
    """Raises Forbidden for a model or data path outside OSCAR_ZOO_JOB_PATHS: a jobs:submit
    token must not make the workers read any file of the host (symlinks resolved, `..` too)."""
    paths = [spec.model] if is_path(spec.model) else []
    paths += data_files((*spec.data, *spec.validation.data))
    for d in (*spec.data, *spec.validation.data):
        _check_dataset_name(d)
    if not paths:
        return
    relative = [p for p in paths if not Path(p).expanduser().is_absolute()]
    if relative:    # checked against this server's directory, read from the runner's own
        raise InvalidInput(f"{relative[0]!r} is a relative path: a job runs on a worker, in a "
                           "directory of its own, so give the absolute path (inside "
                           "OSCAR_ZOO_JOB_PATHS)")
    roots = [Path(r).expanduser().resolve() for r in settings.get("job_paths") or ()]
    for p in paths:
        if not any(Path(p).expanduser().resolve().is_relative_to(r) for r in roots):
            raise Forbidden(f"{p!r} is outside the directories this registry lets jobs read "
                            f"({', '.join(map(str, roots)) or 'none: OSCAR_ZOO_JOB_PATHS is unset'}); "
                            "put it there, name a catalog model or hub id, or ask the operator "
                            "to add its directory to OSCAR_ZOO_JOB_PATHS")


def data_files(entries) -> list[str]:
    """The `data` entries that are files of the workers' hosts (not builtin: or hf:)."""
    return [d for d in entries if not d.startswith(("builtin:", "hf:"))]


# a Hugging Face dataset id as the hub spells them (wikitext, org/name): datasets.load_dataset
# reads a local directory or file by the same argument
_DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def _check_dataset_name(data: str) -> None:
    """Raises Forbidden for an `hf:` entry whose name is not a hub dataset id: `hf:../../x` or
    `hf:/srv/x` would have the workers load a directory of their host, past check_paths."""
    if not data.startswith("hf:"):
        return
    name = data[3:].partition("@")[0].partition(":")[0]
    if not _DATASET_ID.fullmatch(name) or ".." in name:
        raise Forbidden(f"{data!r}: {name!r} is not a Hugging Face dataset id (wikitext, "
                        "org/name); a job reads files only by their path, inside "
                        "OSCAR_ZOO_JOB_PATHS")


# Ray asks for these through num_cpus/num_gpus/memory, never `resources`: in ray_resources its
# task.options() refuses them only in the dispatcher, after the job was claimed.
_RAY_BUILTIN = {"CPU": "the job's `gpus` field sets its GPUs; each task takes 1 CPU",
                "GPU": "ask for GPUs with the job's `gpus` field (e.g. \"gpus\": 2)",
                "memory": "Ray's memory is not asked for per job",
                "object_store_memory": "Ray's memory is not asked for per job"}


def _check_ray_resources(resources: dict[str, float]) -> None:
    for name, amount in resources.items():
        if name in _RAY_BUILTIN:
            raise InvalidInput(f"ray_resources may not name {name!r}: {_RAY_BUILTIN[name]}; "
                               "ray_resources is for your cluster's custom resources, "
                               "e.g. {\"worker_node\": 1}")
        if amount < 0 or (amount > 1 and amount != int(amount)) or 0 < amount < 0.0001:
            raise InvalidInput(f"ray_resources {name!r}: {amount:g} is not an amount Ray accepts; "
                               "use a whole number, or a fraction of 1 (0.0001 or more)")


def _check_geometry(spec: JobSpec, geometry: ModelGeometry) -> None:
    check_int2_geometry(spec.group_size, geometry, lloyd_max=bool(spec.lloyd_max))


def check_int2_geometry(group_size: int | None, geometry: ModelGeometry,
                        lloyd_max: bool = False) -> None:
    """What OSCAR's Hadamard step and the INT2 kernels need of a model's head dims and of the
    group size (None: the default), and Lloyd-Max of the group size. Raises InvalidInput; run
    before the calibration passes."""
    dims = sorted({geometry.head_dim_of(i) for i in geometry.layers()})
    odd = [d for d in dims if d < 64 or d & (d - 1)]
    if odd:
        raise InvalidInput(f"head_dim {', '.join(map(str, odd))}: OSCAR's Hadamard rotation and the "
                           "INT2 kernels need a power of two >= 64, so this model cannot be "
                           "calibrated")
    g = group_size or min(128, dims[0])
    bad = [d for d in dims if d % g]
    if g & (g - 1) or bad:
        raise InvalidInput(f"group_size {g} must be a power of two dividing head_dim "
                           f"({', '.join(map(str, dims))}); try {min(128, dims[0])}")
    if g * 4 < max(dims):
        raise InvalidInput(f"group_size {g} is below head_dim/4 = {max(dims) // 4}, which the "
                           "INT2 decode kernel needs; use a larger group")
    if lloyd_max and g != max(dims):
        # SGLang's grouped kernels ignore SGLANG_LLOYD_MAX: a bundle calibrated for Lloyd-Max
        # with smaller groups would be served uniform, not as it was tuned and validated.
        fix = (f"use group_size {dims[0]}" if len(dims) == 1 else
               f"no single group size fits head_dims {', '.join(map(str, dims))}")
        raise InvalidInput(f"lloyd_max needs group_size == head_dim: OSCAR's Lloyd-Max path "
                           f"(SGLANG_LLOYD_MAX=1) is its single-scale kernel, one scale per row, "
                           f"and group_size {g} is below head_dim {max(dims)}; {fix}, or set "
                           "lloyd_max false to calibrate for uniform INT2 (\"lloyd_max\": false in "
                           "a job spec, --spec for `oscar-zoo jobs submit`; --uniform for "
                           "`oscar-zoo calibrate`; the catalog's default for this model may have "
                           "turned it on)")
