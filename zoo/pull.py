"""`oscar-zoo pull`: resolve a name, fetch and verify a bundle into the cache, export it.

    result = pull("glm-4.7-fp8")                      # recommended, else latest
    result = pull("zai-org/GLM-4.7-FP8@3", fmt="vllm", out=Path("rot/"))
    result = pull("glm-4.7-fp8", layers="0-45")       # one pipeline stage's share

Sources are tried in the order of the `sources` setting (registry, hf, modelscope); a source that
does not have the model, or cannot be reached, hands over to the next. When none could serve it
because some could not be reached or failed on their side (a 5xx, 408, 425, 429: _gave_no_answer)
and the others only said they do not have it, and the cache holds what was asked for, the cached
copy is used (with a warning naming those sources, and the status each answered), like
`hf_hub_download`. Offline mode (OSCAR_ZOO_OFFLINE=1 or HF_HUB_OFFLINE=1) reads only the cache.

The warm path (bundle and export already cached) imports neither numpy, safetensors, pydantic
nor the hub clients: one metadata request, then a few small JSON reads.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from . import catalog, settings
from .cache import Cache, link_file, model_key, seal
from .errors import (BundleFormatError, BundleNotFound, ConfigError, Forbidden, IntegrityError,
                     InvalidInput, ModelNotFound, NotFound, OfflineError, RemoteError,
                     RemoteStorageFull, Unauthorized, VersionNotFound, is_no_space, is_transient)
from .export import ExportResult, check_format, export, layer_spec
from .files import (CACHED_PART, atomic_write_bytes, is_sha256, publish_dir, sha256_bytes, sha256_file,
                    staging_dir)
from .sources.base import Plan, Ref, parse_spec, status_note
from .sources.download import RemoteFile, StopSignal, download_to, fetch

MANIFEST = "bundle.json"
_FALLBACK = (NotFound, RemoteError, OfflineError, Unauthorized, Forbidden, IntegrityError)


@dataclass(frozen=True)
class Note:
    """Something pull tells besides its result, and how loud, said where the note is made.

    info: -q hides it. warning: said even under -q (the sources failed, so the cache answered).
    bundle: a warning about the bundle served (yanked, a draft, not the one asked for), which
    the launch recipe's header carries too: `pull ... > serve.sh` leaves stderr behind.
    Not guessed from the text: a reworded note, or a yank reason, model name or cache path that
    holds a keyword, would change its weight."""

    text: str
    level: str = "info"     # info | warning | bundle

    def __post_init__(self):
        if self.level not in ("info", "warning", "bundle"):   # a typo must not pass for one
            raise ValueError(f"unknown note level {self.level!r}")

    @property
    def warning(self) -> bool:
        return self.level != "info"

    @property
    def in_recipe(self) -> bool:
        return self.level == "bundle"


@dataclass
class PullResult:
    model: str
    digest: str
    source: str
    origin: str
    version: int | None
    path: Path                          # the snapshot (or the --layers partial) directory
    imported: bool
    validated: bool | None
    status: str | None
    cached: bool                        # nothing had to be downloaded
    layers: list[int] | None = None
    export: ExportResult | None = None
    notes: list[Note] = field(default_factory=list)
    fetched_bytes: int = 0

    def to_dict(self) -> dict:
        return {"model": self.model, "version": self.version, "digest": self.digest,
                "source": self.source, "origin": self.origin, "imported": self.imported,
                "validated": self.validated, "status": self.status, "cached": self.cached,
                "path": str(self.path), "layers": self.layers,
                "notes": [n.text for n in self.notes],
                "warnings": [n.text for n in self.notes if n.warning],
                "fetched_bytes": self.fetched_bytes,
                "export": self.export.to_dict() if self.export else None}


# --- entry point -------------------------------------------------------------------------------

def pull(spec: str, *, layers: str | None = None, fmt: str | None = None, out: Path | None = None,
         cache: Cache | None = None, progress: bool = True,
         sources: list[str] | None = None) -> PullResult:
    """Resolve, fetch, verify and cache one bundle; export it when `fmt` is given.

    Raises ModelNotFound (with suggestions), VersionNotFound, BundleNotFound, OfflineError,
    RemoteError, Unauthorized, Forbidden, IntegrityError, LockTimeout, InvalidInput,
    StorageFull (the cache's disk, or --out's, is full; nothing half-written is kept).
    """
    cache = cache or Cache()
    name, ref = parse_spec(spec)
    if layers is not None:
        parse_layer_spec(layers)  # fail on a typo before any network
    if fmt is not None:
        check_format(fmt, None)  # an unknown format, too, before any network
    entry = catalog.find(name)
    offline = settings.is_offline()
    with cache.out_of_space(f"pulling {spec}"):
        if not offline:
            cache.ensure()
        # One hold of the gc lock from the first request to the last export file: prune and
        # cache rm wait for all of it. Released in between, a `cache rm` (or a prune, after
        # another pull moved the ref) could take the snapshot away just before the export read it.
        with cache.gc_guard():
            if offline:
                result = from_cache(cache, entry, name, ref, "offline mode is on "
                                    "(OSCAR_ZOO_OFFLINE or HF_HUB_OFFLINE)", layers)
            else:
                result = _pull_online(cache, entry, name, ref, layers, progress, sources, fmt)
            if layers and result.layers is None:  # a whole bundle (hub files are whole): slice
                result.layers = _layers_of(result.path, layers)
                if result.imported and not result.cached:
                    result.notes.append(Note(f"RotationZoo files hold every layer, so all of "
                                             f"them were fetched; the export keeps layers "
                                             f"{layer_spec(result.layers)}"))
            if fmt is not None:
                result.export = export(cache, result.digest, result.path, fmt, result.layers, out)
    return result


def _sources(names: list[str] | None, cache: Cache):
    out = []
    for name in names if names is not None else settings.get("sources"):
        if name == "registry":
            from .registry_client import RegistryClient
            from .sources.registry import RegistrySource

            client = RegistryClient()
            if client.configured:
                out.append(RegistrySource(client))
        elif name in ("hf", "modelscope"):
            from .sources.rotationzoo import RotationZooSource

            out.extend(_mirror_sources(name, cache))
            out.append(RotationZooSource(name))
        else:
            raise ConfigError(f"unknown source {name!r} in OSCAR_ZOO_SOURCES; use registry, hf, "
                              "modelscope")
    return out


def _mirror_sources(kind: str, cache: Cache) -> list:
    repo = settings.get("hf_mirror_repo" if kind == "hf" else "modelscope_mirror_repo")
    if not repo:
        return []
    from .sources.mirror import MirrorSource

    return [MirrorSource(kind, repo, cache)]


def _pull_online(cache, entry, name, ref, layers, progress, source_names, fmt=None) -> PullResult:
    sources = _sources(source_names, cache)
    if not sources:
        raise _no_source(cache, entry, name, ref, layers, source_names)
    if entry is None and not any(s.name == "registry" for s in sources):
        raise ModelNotFound(f"unknown model {name!r}.", suggestions=catalog.suggest(name))
    failures: list[_Failure] = []
    for source in sources:
        try:
            _check_alias_still_open(source, ref, failures)
            plan = source.plan(entry, name, ref)
            _learn_statuses(cache, source)
            if ref.alias and ref.alias not in plan.refs:
                # the alias asked for, as HF's refs/<revision>: the RotationZoo and the mirrors
                # answer @latest and @recommended without naming them, and offline the same
                # request looks them up (Ref.cache_refs)
                plan.refs.append(ref.alias)
            return _materialize(plan, cache, layers, progress, fmt)  # pull() holds the gc lock
        except _FALLBACK as e:
            _learn_statuses(cache, source)     # a refusal may say something of cached versions
            failures.append(_Failure(source.name, getattr(source, "where", source.name), e,
                                     _no_opinion(source, e)))
    cache_said = ""
    if _cache_may_answer(failures):
        model = cached_name(cache, entry, name)
        result = _cached_answer(cache, model, ref, layers)
        if result is not None:
            # about the sources, not the bundle: the recipe does not carry it
            result.notes.insert(0, Note(f"{_fallback_why(failures)}; using the cached copy",
                                        "warning"))
            return result
        # what the cache holds instead; not "pull it once": that is what just failed, and the
        # sources' reasons say what to fix
        cache_said = f"; and {_cache_lacks(cache, model, ref)}"
        if fix := _parts_fix(cache, model, ref):
            cache_said += f". To fix: {fix}"
    raise _combine(failures, entry, name, ref, cache_said)


def _no_source(cache, entry, name: str, ref: Ref, layers: str | None,
               asked: list[str] | None) -> ConfigError:
    """The error for a source list with none configured (`--source registry`, or
    OSCAR_ZOO_SOURCES=registry, with OSCAR_ZOO_ENDPOINT unset): where the list came from, what
    it lacks, the fixes, and the cached copy if there is one. Not served by itself: the cache
    stands in for sources that could not answer (an outage), not for a setting to fix, which
    it would hide on every pull while the bundle is never updated."""
    listed = asked if asked is not None else settings.get("sources")
    where = (f"--source {' --source '.join(asked)}" if asked is not None
             else f"OSCAR_ZOO_SOURCES ({','.join(listed)})")
    lacks = ("names only the registry, which needs OSCAR_ZOO_ENDPOINT (not set)" if listed
             else "names no source")
    message = (f"no source to pull from: {where} {lacks}. To fix: "
               f"{', or '.join(_no_source_fixes(asked, listed))}")
    cached = _cached_answer(cache, cached_name(cache, entry, name), ref, layers)
    if cached is not None:
        version = f"v{cached.version}, " if cached.version is not None else ""
        message += (f". {_asked(cached.model, ref)} is in the cache ({version}sha256:"
                    f"{cached.digest[:12]}): OSCAR_ZOO_OFFLINE=1 serves that copy without "
                    "asking any source")
    return ConfigError(message)


def _no_source_fixes(asked: list[str] | None, listed: list[str]) -> list[str]:
    """What gives a pull a source: the registry's URL, a hub, or (after --source) the list of
    OSCAR_ZOO_SOURCES where that names a hub."""
    if not listed:      # OSCAR_ZOO_SOURCES set empty
        return ["name sources in OSCAR_ZOO_SOURCES (e.g. registry,hf,modelscope)"]
    fixes = ["set OSCAR_ZOO_ENDPOINT to the registry's URL (e.g. http://127.0.0.1:8000)"]
    if asked is None:
        return fixes + ["add hf or modelscope to OSCAR_ZOO_SOURCES"]
    fixes.append("pass --source hf or --source modelscope")
    default = settings.get("sources")
    if set(default) - {"registry"}:
        fixes.append(f"drop --source to pull from OSCAR_ZOO_SOURCES ({','.join(default)})")
    return fixes


def _check_alias_still_open(source, ref: Ref, failures: list[_Failure]) -> None:
    """The RotationZoo answers @recommended and @latest with its one shipped calibration, which
    is right only where nobody holds versions of ours. Once a source that does (the registry, a
    mirror) has refused the alias, the RotationZoo answering it would hand out another bundle
    than the one asked for, under that alias, and the user would never see the refusal."""
    if ref.alias is None or not getattr(source, "answers_from_catalog", False):
        return
    refused = next((f for f in failures if isinstance(f.error, VersionNotFound)), None)
    if refused is not None:
        raise VersionNotFound(f"{source.name}: not answering @{ref.alias} with the RotationZoo's "
                              f"shipped calibration: {refused.where} holds versions of this model "
                              f"and did not serve @{ref.alias} (a registry alias: the registry "
                              "alone says which version it is), and the shipped calibration is "
                              "none of them")


@dataclass(frozen=True)
class _Failure:
    """Why one source did not serve the pull."""

    source: str         # its name: registry, hf, modelscope
    where: str          # as messages name it: the registry with its URL
    error: Exception
    quiet: bool         # a "not found" that says nothing about the bundle (_no_opinion)

    @property
    def reason(self) -> str:
        # one reason among several, joined with "; ": a sentence's own full stop would show as ".;"
        text = str(self.error)
        return text[:-1] if text.endswith(".") and not text.endswith("...") else text


def _no_opinion(source, e: Exception) -> bool:
    """A failure that says nothing against a cached copy: the source does not know the model at
    all, or it is the RotationZoo, which answers from the catalog (no network) and never holds
    what the registry published. A reached registry or mirror saying the version or alias is
    gone (removed, yanked) has an opinion, and a cached copy must not overrule it."""
    return isinstance(e, ModelNotFound) or (isinstance(e, NotFound)
                                            and getattr(source, "answers_from_catalog", False))


def _gave_no_answer(e: Exception) -> bool:
    """The source could not answer at all: unreachable, or failing on its side.

    A 5xx is the server's own failure, not a word about the bundle: a 500 (a bug, possibly on
    every request), 502/504 (a proxy whose backend is gone), 503 (overloaded, in maintenance),
    507 (its disk is full). So are 408, 425 and 429 (errors.TRY_LATER: too slow, too early, too
    many requests), as hf_hub_download also reads them. For the user each is an outage like a
    refused connection, so a cached copy may stand in, with a warning naming the status: a 500
    that persists still shows on every pull. So may an answer that is no answer (a proxy's web
    page where JSON should be, a damaged listing: no status). Another 4xx may not: the server
    did answer this request (a bad request, a file gone for good), and serving a cached copy
    instead would hide that answer from the user. That is is_transient's rule, less its
    exception for a full disk, which is an outage here too."""
    return is_transient(e) or isinstance(e, RemoteStorageFull)


def _cache_may_answer(failures: list[_Failure]) -> bool:
    """Whether a cached copy may stand in: some source gave no answer (_gave_no_answer) and
    every other one had no opinion. A corrupt download, a refused token, a 4xx or a version the
    registry says is gone is for the user to see, not for a cached copy to hide."""
    return (any(_gave_no_answer(f.error) for f in failures)
            and all(_gave_no_answer(f.error) or f.quiet for f in failures))


def _fallback_why(failures: list[_Failure]) -> str:
    """Why the cache answers: which sources could not be reached, which were but failed (the
    HTTP status, and where), and what the others said."""
    unreachable = [f for f in failures if isinstance(f.error, OfflineError)]
    failed = [f for f in failures if _gave_no_answer(f.error) and f not in unreachable]
    others = [f for f in failures if not _gave_no_answer(f.error)]
    if len(unreachable) == len(failures):
        return f"no source could be reached ({_join(failures)})"
    clauses = [_failed_clause(f) for f in failed]
    if unreachable:
        clauses.insert(0, f"{_names(unreachable)} could not be reached ({_join(unreachable)})")
    if others:
        names = _names(others)
        clauses.append(f"{names} {'has' if ',' not in names else 'have'} no such bundle "
                       f"({_join(others)})")
    return ", and ".join(clauses)


def _failed_clause(f: _Failure) -> str:
    """registry http://reg:8000 was reached but answered HTTP 503 (503 Service Unavailable)."""
    status = getattr(f.error, "status", None)
    what = f"answered HTTP {status}" if status is not None else "gave no usable answer"
    return f"{f.where} was reached but {what} ({f.reason.removeprefix(f'{f.where}: ')})"


def _names(failures: list[_Failure]) -> str:
    return ", ".join(dict.fromkeys(f.source for f in failures))


def _join(failures: list[_Failure]) -> str:
    return "; ".join(f.reason for f in failures)


def _combine(failures: list[_Failure], entry, name: str, ref: Ref,
             cache_said: str = "") -> Exception:
    """One error for all sources: the most actionable class, every source's reason (and, after
    a fallback that found nothing, what the cache said)."""
    what = f"{name}@{ref.label}" if not ref.is_default else name
    message = f"could not pull {what}: {_join(failures)}{cache_said}"
    errors = [f.error for f in failures]
    for cls in (Unauthorized, Forbidden, IntegrityError, RemoteError, OfflineError):
        if any(isinstance(e, cls) for e in errors):
            return cls(message)
    if any(isinstance(e, VersionNotFound) for e in errors):
        return VersionNotFound(message)
    if entry is None and all(isinstance(e, ModelNotFound) for e in errors):
        suggestions = list(dict.fromkeys(
            [s for e in errors for s in getattr(e, "suggestions", [])] + catalog.suggest(name)))
        return ModelNotFound(f"unknown model {name!r} (asked: {_names(failures)}).",
                             suggestions=suggestions[:5])
    return BundleNotFound(message)


# --- fetching a plan into the cache ------------------------------------------------------------

def materialize(plan: Plan, cache: Cache, layers: str | None = None, progress: bool = True,
                fmt: str | None = None) -> PullResult:
    """Download what the plan names (unless cached), verify it, link the snapshot, record refs.

    With `fmt`, a bundle that format cannot carry is refused before its rotations are fetched.
    Takes the gc lock; pull() holds it already (it is not reentrant: a prune waiting between
    two holds would deadlock them) and calls _materialize.
    """
    with cache.out_of_space(f"caching {plan.model} from {plan.origin}"):
        cache.ensure()
        with cache.gc_guard():  # a prune now would take our new blobs for garbage
            return _materialize(plan, cache, layers, progress, fmt)


def _materialize(plan: Plan, cache: Cache, layers: str | None, progress: bool,
                 fmt: str | None) -> PullResult:
    if plan.kind == "bundle":
        snap = plan.digest and cache.snapshot(plan.model, plan.digest)
        if layers and plan.partial and not snap:
            return _materialize_partial(plan, cache, layers, progress, fmt)
        digest, path, fetched = _materialize_bundle(plan, cache, progress, fmt)
        imported = False
    else:
        digest, path, fetched = _materialize_import(plan, cache, progress, fmt)
        imported = True
    old = cache.read_meta(plan.model, digest) or {}
    meta = _with_status(dict(old, model=plan.model, digest=digest, source=plan.source,
                             origin=plan.origin, imported=imported, validated=plan.validated),
                        plan.status, plan.yank_reason)
    if plan.version is not None:
        meta["version"] = plan.version
    if fetched or "files" not in meta:
        meta["files"] = _snapshot_files(path)
    if plan.kind == "oscar-pt":
        meta["origin_files"] = {f.name: f.sha256 for f in plan.files if f.sha256}
    if meta != old:  # a warm pull rewrites (and fsyncs) nothing
        meta["pulled_at"] = _now()
        cache.write_meta(plan.model, digest, meta)
    for ref in plan.refs:
        cache.write_ref(plan.model, ref, digest)
    return PullResult(plan.model, digest, plan.source, plan.origin, plan.version, path, imported,
                      plan.validated, plan.status, cached=not fetched, notes=_plan_notes(plan),
                      fetched_bytes=fetched)


def _with_status(meta: dict, status: str | None, yank_reason: str | None) -> dict:
    """`meta` with the source's latest word on the bundle's status: what an offline pull or an
    export warns of (_cached_result). No yank_reason key unless yanked, so the meta of a
    published bundle reads as it did before reasons were recorded (a warm pull rewrites none)."""
    meta["status"] = status
    if status == "yanked" and yank_reason:
        meta["yank_reason"] = yank_reason
    else:
        meta.pop("yank_reason", None)
    return meta


def _learn_statuses(cache: Cache, source) -> None:
    """Record in the cache what a source's answer said of versions cached earlier: a yank (or a
    promotion) of v1 seen while planning v2, or behind a "no published version" refusal, which
    plans nothing. Else the cache's meta keeps "published" for a version the registry has
    yanked, and an offline pull serves it (through the `latest` ref it last recorded) without
    a word. Only bundles already cached are touched."""
    from .sources.registry import RegistrySource      # only the registry lists other versions

    if not isinstance(source, RegistrySource) or source.seen is None:
        return
    model, versions = source.seen
    for v in versions:
        digest = v.get("digest") if isinstance(v, dict) else None
        old = cache.read_meta(model, digest) if isinstance(digest, str) and is_sha256(digest) else {}
        if not old or old.get("version") != v.get("version"):
            continue
        meta = _with_status(dict(old), v.get("status"), v.get("yank_reason"))
        if meta != old:
            cache.write_meta(model, digest, meta)


def _plan_notes(plan: Plan) -> list[Note]:
    """A source's notes: on a yanked or draft version, why (the registry's yank reason), which
    is about the bundle served; else information (ModelScope's pinning by sha256). Taken from
    the plan's status, the source's own word, never from the notes' text."""
    level = "bundle" if plan.status in ("yanked", "draft") else "info"
    return [Note(text, level) for text in plan.notes]


def _materialize_bundle(plan: Plan, cache: Cache, progress: bool,
                        fmt: str | None) -> tuple[str, Path, int]:
    if plan.digest and cache.snapshot(plan.model, plan.digest):
        return plan.digest, cache.snapshot_dir(plan.model, plan.digest), 0
    key = plan.digest or sha256_bytes(plan.origin.encode())
    with cache.lock(f"snapshot-{model_key(plan.model)}-{key}", f"the snapshot of {plan.model}"):
        if plan.digest and cache.snapshot(plan.model, plan.digest):
            return plan.digest, cache.snapshot_dir(plan.model, plan.digest), 0
        fetched = 0
        if isinstance(plan.manifest, bytes):
            raw = plan.manifest
        else:
            sha = fetch(plan.manifest, cache, progress)
            raw = cache.blob(sha).read_bytes()
            fetched += len(raw)
        digest = sha256_bytes(raw)
        if plan.digest and digest != plan.digest:
            raise IntegrityError(f"{plan.origin}: bundle.json hashes to {digest[:12]}... but the "
                                 f"source announced {plan.digest[:12]}...; nothing was cached")
        # the schema before anything it lists is fetched (a file named bundle.json would stand
        # in for the manifest just hashed); the tensors are checked once linked (_check_snapshot)
        from .manifest import parse_manifest

        manifest = parse_manifest(raw, where=f"{plan.origin}: {MANIFEST}")
        if fmt is not None:
            check_format(fmt, manifest.method.granularity)
        cache.add_bytes(raw, digest)
        remotes = [plan.locate(f.name, f.sha256, f.size) for f in manifest.files]
        fetched += sum(f.size or 0 for f in remotes if not cache.has_blob(f.sha256, f.size))
        shas = _fetch_all(remotes, cache, progress)
        files = {MANIFEST: digest, **{f.name: s for f, s in zip(remotes, shas)}}
        return digest, cache.link_snapshot(plan.model, digest, files, check=_check_snapshot), fetched


def _materialize_import(plan: Plan, cache: Cache, progress: bool,
                        fmt: str | None) -> tuple[str, Path, int]:
    digest = cache.read_import(plan.model, plan.import_key)
    if digest and cache.snapshot(plan.model, digest):
        return digest, cache.snapshot_dir(plan.model, digest), 0
    if fmt is not None:
        # The catalog's word: the .pt files are torch pickles that say how they are grouped only
        # once downloaded whole. export() checks the converted manifest again.
        check_format(fmt, plan.granularity)
    with cache.lock(f"import-{model_key(plan.model)}-{plan.import_key}",
                    f"the import of {plan.model}"):
        digest = cache.read_import(plan.model, plan.import_key)
        if digest and cache.snapshot(plan.model, digest):
            return digest, cache.snapshot_dir(plan.model, digest), 0
        fetched = sum(f.size or 0 for f in plan.files if not (f.sha256 and cache.has_blob(f.sha256, f.size)))
        shas = _fetch_all(plan.files, cache, progress)
        _note(f"converting {plan.files[0].name} + {plan.files[1].name} to a bundle "
              f"(imported from {plan.origin})", progress)
        bundle = plan.convert({"k": cache.blob(shas[0]), "v": cache.blob(shas[1])})
        digest, path = _store_bundle(bundle, plan.model, cache)
        cache.write_import(plan.model, plan.import_key, digest)
        return digest, path, fetched


def _store_bundle(bundle, model: str, cache: Cache) -> tuple[str, Path]:
    """Write a Bundle object, move its files into the blob store, link the snapshot."""
    import tempfile

    from .bundle import write

    tmp_root = cache.root / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        written = write(bundle, Path(tmp) / "bundle")
        digest = written.digest
        files = {}
        for p in sorted(Path(tmp, "bundle").iterdir()):
            sha = sha256_file(p)
            if not cache.has_blob(sha):
                cache.adopt(p, sha)
            files[p.name] = sha
        if files[MANIFEST] != digest:
            raise BundleFormatError("the written bundle.json does not hash to the bundle digest")
        return digest, cache.link_snapshot(model, digest, files)


def _check_snapshot(path: Path) -> None:
    """What a consumer relies on beyond the sha256 of each file (checked as it was fetched,
    against the manifest): the manifest schema, tensor names, shapes, dtypes, finite values,
    orthogonal rotations. Runs before the snapshot appears, so nothing half-trusted does."""
    from safetensors.numpy import load_file

    from .bundle import check_tensors, read_manifest

    check_tensors(read_manifest(path), load_file(str(path / "rotations.safetensors")))


def _fetch_all(remotes: list[RemoteFile], cache: Cache, progress: bool) -> list[str]:
    """Up to 4 files at a time. When one fails, or on Ctrl-C, the others stop at their next
    chunk (their partial files kept for the next pull to resume, unless the disk is full)
    rather than run to the end."""
    if len(remotes) <= 1:
        return [fetch(r, cache, progress) for r in remotes]
    stop = StopSignal()
    with ThreadPoolExecutor(max_workers=min(4, len(remotes))) as pool:
        futures = [pool.submit(fetch, r, cache, progress, stop) for r in remotes]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            _stop_all(stop, futures)
            raise
        failed = [f.exception() for f in futures if f in done and f.exception() is not None]
        if failed:
            stop.full_disk = any(is_no_space(e) for e in failed)
            _stop_all(stop, futures)
            raise failed[0]
        return [f.result() for f in futures]


def _stop_all(stop: threading.Event, futures: list) -> None:
    stop.set()
    for f in futures:
        f.cancel()


def _snapshot_files(path: Path) -> dict[str, str]:
    import os

    out = {}
    for p in sorted(path.iterdir()):
        if p.is_symlink():
            out[p.name] = Path(os.readlink(p)).name
        elif p.is_file() and not p.name.startswith("."):
            out[p.name] = sha256_file(p)
    return out


# --- --layers ----------------------------------------------------------------------------------

def parse_layer_spec(spec: str) -> list[tuple[int, int, bool]]:
    """`0-45,60` -> [(0, 45, True), (60, 60, False)] (the flag: it was a range)."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        if not _number(lo) or (dash and not _number(hi)):
            raise InvalidInput(f"bad --layers {spec!r}: use layer numbers and ranges, e.g. 0-45 or 0-45,60")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a > b:
            raise InvalidInput(f"bad --layers range {item!r}: the start is past the end")
        out.append((a, b, bool(dash)))
    return out


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone takes '²', which int() refuses


def select_layers(spec: str, available: list[int], num_layers: int | None = None) -> list[int]:
    """The listed layers the bundle has: a range keeps the layers it covers (hybrid models have
    gaps), a single layer must exist, and no range may reach past the model's last layer
    (`num_layers` - 1; without it, the last of `available`): 0-99 on a 30-layer model is a
    mistake to say, not a request to clamp. Raises InvalidInput."""
    total = num_layers or available[-1] + 1
    chosen = set()
    for a, b, is_range in parse_layer_spec(spec):
        if not is_range and a not in available:
            raise InvalidInput(f"--layers {spec}: the bundle has no layer {a}")
        if b >= total:
            raise InvalidInput(f"--layers {spec}: the model has {total} layers (0-{total - 1}), "
                               f"so {a}-{b} goes past its last layer; pass ranges within "
                               f"0-{total - 1}, or leave --layers out for the whole bundle")
        chosen |= {i for i in available if a <= i <= b}
    if not chosen:
        raise InvalidInput(f"--layers {spec}: none of the bundle's {len(available)} layers "
                           f"({available[0]}..{available[-1]}) is in it")
    return sorted(chosen)


def _check_partial(part: Path, plan: Plan, manifest, chosen: list[int]) -> str:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from .bundle import check_tensors

    try:
        with safe_open(str(part), "np") as f:
            header = f.metadata() or {}
        tensors = load_file(str(part))
        if header.get("digest") not in (None, plan.digest):
            raise BundleFormatError("it belongs to another bundle")
        sub = manifest.model_copy(update={"geometry": manifest.geometry.model_copy(
            update={"attention_layers": chosen})})
        check_tensors(sub, tensors)
    except Exception as e:
        part.unlink(missing_ok=True)
        raise IntegrityError(f"{plan.origin}: the layer file failed verification ({e}); it was "
                             "deleted, run the command again") from None
    return sha256_file(part)


def _layers_of(bundle_dir: Path, spec: str) -> list[int]:
    m = json.loads((bundle_dir / MANIFEST).read_text())
    geo = m["geometry"]
    available = geo["attention_layers"] or list(range(geo["num_layers"]))
    return select_layers(spec, available, geo["num_layers"])


def _materialize_partial(plan: Plan, cache: Cache, spec: str, progress: bool,
                         fmt: str | None) -> PullResult:
    """Fetch only some layers from the registry (layers.safetensors). The registry has no
    per-layer hashes, so the part is checked structurally: the bundle digest in its header,
    tensor names and shapes against the manifest, finite values, orthogonal rotations."""
    raw = plan.manifest if isinstance(plan.manifest, bytes) else \
        cache.blob(fetch(plan.manifest, cache, progress)).read_bytes()
    if sha256_bytes(raw) != plan.digest:
        raise IntegrityError(f"{plan.origin}: bundle.json does not hash to the announced digest")
    # read plainly: pydantic (parse_manifest) is for a part not yet here, so a warm pull skips it
    available, granularity, num_layers = _layers_and_granularity(raw)
    if fmt is not None:
        check_format(fmt, granularity)
    chosen = select_layers(spec, available, num_layers)
    pdir = cache.partial_dir(plan.model, plan.digest, layer_spec(chosen))
    fetched = 0
    if _part_layers(pdir) != chosen:
        with cache.lock(f"partial-{plan.digest}-{layer_spec(chosen)}", "a --layers download"):
            if _part_layers(pdir) != chosen:
                fetched = _fetch_part(plan, cache, raw, chosen, pdir, progress)
    _record(plan, cache)
    notes = _plan_notes(plan) + [Note(f"fetched layers {layer_spec(chosen)} only ({len(chosen)} "
                                      f"of {len(available)}), checked structurally (the registry "
                                      "keeps no per-layer hashes)")]
    return PullResult(plan.model, plan.digest, plan.source, plan.origin, plan.version, pdir, False,
                      plan.validated, plan.status, cached=fetched == 0, layers=chosen,
                      notes=notes, fetched_bytes=fetched)


def _part_layers(pdir: Path) -> list[int] | None:
    """The layers a cached --layers part holds (its .partial.json); None if it holds none."""
    try:
        return json.loads((pdir / CACHED_PART).read_text())["layers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _layers_and_granularity(raw: bytes) -> tuple[list[int], str, int]:
    """The bundle's layers with a KV cache, its rotation granularity and the model's layer count;
    a manifest that does not even say these gets the schema's own error."""
    try:
        m = json.loads(raw)
        geo = m["geometry"]
        n = int(geo["num_layers"])
        return list(geo.get("attention_layers") or range(n)), m["method"]["granularity"], n
    except (ValueError, KeyError, TypeError):
        from .manifest import parse_manifest

        parse_manifest(raw)  # raises BundleFormatError saying what is wrong
        raise


def _fetch_part(plan: Plan, cache: Cache, raw: bytes, chosen: list[int], pdir: Path,
                progress: bool) -> int:
    """Download, check and link one --layers part; returns the bytes fetched."""
    from .manifest import parse_manifest

    manifest = parse_manifest(raw)
    cache.add_bytes(raw, plan.digest)
    remote = plan.partial(",".join(map(str, chosen)))
    part = cache.incomplete(f"partial-{plan.digest[:16]}-{layer_spec(chosen)}")
    download_to(remote, part, progress)
    fetched = part.stat().st_size
    sha = _check_partial(part, plan, manifest, chosen)
    cache.adopt(part, sha)
    with staging_dir(pdir) as tmp:
        link_file(cache.blob(plan.digest), tmp / MANIFEST)
        link_file(cache.blob(sha), tmp / "rotations.safetensors")
        atomic_write_bytes(tmp / CACHED_PART, json.dumps(
            {"layers": chosen, "rotations.safetensors": sha}).encode())
        publish_dir(tmp, pdir)
    seal(pdir)
    return fetched


def _record(plan: Plan, cache: Cache) -> None:
    """Refs and meta of a --layers part; a warm pull rewrites (and fsyncs) nothing."""
    for ref in plan.refs:
        cache.write_ref(plan.model, ref, plan.digest)
    old = cache.read_meta(plan.model, plan.digest) or {}
    meta = _with_status(dict(old, model=plan.model, digest=plan.digest, source=plan.source,
                             origin=plan.origin, imported=False, validated=plan.validated,
                             version=plan.version), plan.status, plan.yank_reason)
    if meta != old:
        meta["pulled_at"] = _now()
        cache.write_meta(plan.model, plan.digest, meta)


# --- the cache alone ---------------------------------------------------------------------------

def from_cache(cache: Cache, entry, name: str, ref: Ref, why: str,
               layers: str | None = None) -> PullResult:
    """The cached bundle for (name, ref), without touching the network.

    Raises OfflineError naming what is cached when the request is not.
    """
    model = cached_name(cache, entry, name)
    result = _cached_answer(cache, model, ref, layers)
    if result is not None:
        return result
    have = _held_refs(cache, model)
    if entry is None and not have:
        raise ModelNotFound(f"unknown model {name!r}, and nothing by that name is cached "
                            f"({why}).", suggestions=catalog.suggest(name))
    fix = _parts_fix(cache, model, ref) or f"pull it once (oscar-zoo pull {_asked(model, ref)})"
    if settings.is_offline():
        fix += " with OSCAR_ZOO_OFFLINE and HF_HUB_OFFLINE unset"
    raise OfflineError(f"{why}, and {_cache_lacks(cache, model, ref, have)}. To fix: {fix}.")


def cached_name(cache: Cache, entry, name: str) -> str:
    """The model's name in the cache for a name as given: the catalog's name for any of its
    names, else the cache's own (Cache.model_named: a registry-only model by its hub id)."""
    return entry.name if entry is not None else cache.model_named(name)


def _cached_answer(cache: Cache, model: str, ref: Ref, layers: str | None) -> PullResult | None:
    """The cached bundle the first of the ref's cache refs names (whole, or the --layers part
    that holds `layers`), or None."""
    passed_over: list[str] = []   # a default request's refs the cache knows but cannot serve
    for r in ref.cache_refs():
        digest = cache.read_ref(model, r)
        result = _cached_for(cache, model, digest, layers) if digest else None
        if result is not None:
            if passed_over:   # offline, "recommended, else latest" must not pass silently
                result.notes.append(Note(f"{model}{' and '.join(passed_over)}: not cached "
                                         f"whole, so @{r} (sha256:{digest[:12]}) was served "
                                         f"instead; pull {model} online for it", "bundle"))
            return result
        if digest:
            parts = _part_specs(cache, model, digest)
            passed_over.append(f"@{r} (sha256:{digest[:12]}"
                               + (f", only layers {', '.join(parts)} cached)" if parts else ")"))
    return None


def _asked(model: str, ref: Ref) -> str:
    return model if ref.is_default else f"{model}@{ref.label}"


def _cache_lacks(cache: Cache, model: str, ref: Ref, have: list[str] | None = None) -> str:
    """What the cache holds instead of the bundle asked for, as one clause: said once, for the
    offline error and for a pull whose sources failed alike ("x is not in the cache; x is not
    cached at all" said it twice)."""
    have = _held_refs(cache, model) if have is None else have
    if not have:
        return f"{model} is not cached at all ({cache.root})"
    return (f"{_asked(model, ref)} is not in the cache ({cache.root}); cached refs of {model}: "
            f"{', '.join(have)}")


def _parts_fix(cache: Cache, model: str, ref: Ref) -> str | None:
    """The fix when only --layers parts of the bundle asked for are cached."""
    parts = _cached_parts(cache, model, ref)
    return (f"only layers {', '.join(parts)} of it are cached: pass --layers with one of them, "
            "or pull it whole") if parts else None


def _held_refs(cache: Cache, model: str) -> list[str]:
    """The model's refs whose bundle is still cached, as a message lists them: a ref to a
    bundle held only as --layers parts says which layers. A ref whose bundle went (a `verify`
    repair of an older oscar-zoo left such refs behind) is not listed: nothing would serve it."""
    if not cache.model_dir(model).exists():
        return []
    out = []
    for ref, digest in sorted(cache.refs(model).items()):
        if cache.snapshot(model, digest):
            out.append(ref)
        elif parts := _part_specs(cache, model, digest):
            out.append(f"{ref} (only layers {', '.join(parts)})")
    return out


def _cached_for(cache: Cache, model: str, digest: str, layers: str | None) -> PullResult | None:
    """The cached bundle `digest` whole, or the --layers part of it that holds `layers`."""
    if cache.snapshot(model, digest):
        return _cached_result(cache, model, digest, cache.snapshot_dir(model, digest))
    if layers:
        for pdir in sorted((cache.model_dir(model) / "partial" / digest).glob("layers-*")):
            chosen = _part_layers(pdir) or []
            # against the whole bundle's layers: a range checked against the part's own
            # list always fits, and 0-45 would be answered with a cached 0-3
            want = _layers_of(pdir, layers)
            if set(want) <= set(chosen):
                result = _cached_result(cache, model, digest, pdir)
                result.layers = want
                return result
    return None


def _cached_parts(cache: Cache, model: str, ref: Ref) -> list[str]:
    """The --layers parts cached for the bundle `ref` names, as layer specs (0-4, 0-9)."""
    for r in ref.cache_refs():
        digest = cache.read_ref(model, r)
        if digest:
            return _part_specs(cache, model, digest)
    return []


def _part_specs(cache: Cache, model: str, digest: str) -> list[str]:
    return sorted(p.name.removeprefix("layers-") for p in
                  (cache.model_dir(model) / "partial" / digest).glob("layers-*"))


def _cached_result(cache: Cache, model: str, digest: str, path: Path) -> PullResult:
    meta = cache.read_meta(model, digest)
    notes = [Note(f"served from the cache ({cache.root})")]
    # the warning an online pull gives (yanked, a draft), from what the sources last said of it
    warning = status_note(model, meta.get("version"), meta.get("status"), meta.get("yank_reason"))
    if warning:
        notes.append(Note(warning, "bundle"))
    return PullResult(model, digest, meta.get("source", "cache"), meta.get("origin", str(path)),
                      meta.get("version"), path, bool(meta.get("imported")),
                      meta.get("validated"), meta.get("status"), cached=True, notes=notes)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _note(message: str, enabled: bool) -> None:
    if enabled:
        print(message, file=sys.stderr, flush=True)
