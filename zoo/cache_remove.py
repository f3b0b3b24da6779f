"""`oscar-zoo cache rm`: remove a model, or some of its bundles, from the local cache.

Arguments are resolved to digests first (every one checked before anything goes), then removed
under the cache's gc.lock held exclusively, as prune holds it: refs first, so no pull finds a
bundle that is going by its name; then each directory renamed aside into tmp/ and deleted there
(cache._delete); then the exports and blobs no bundle left in the cache uses (cache._blobs_of,
prune's walk).

`cache rm --rescued` removes bundles `oscar-zoo calibrate` saved under rescued/ when its --out was
full (which prune and a removal of models leave alone), the same way: named by their directory
there and resolved first, then renamed aside under the lock. A calibrate writes them holding the
lock shared, so none is removed half-written; and a dir goes only as the user confirmed it (what
it held then), never one a calibrate finished or a user moved a bundle into since.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .cache import (_LEFTOVER_AGE, Cache, Rescued, _blobs_of, _delete, _entries, _freed, _links,
                    _read_digest, _rmdir_if_empty, drop_emptied_model_dirs, drop_refs,
                    model_dirs, model_key)
from .errors import (AliasNotFound, BundleNotFound, InvalidInput, ModelNotFound, NotFound,
                     UnsafePathError, VersionNotFound)
from .files import is_sha256


@dataclass(frozen=True)
class Target:
    """One `cache rm` argument, resolved: bundles of one model, by digest, so that what the user
    confirmed is what goes even if a ref moves meanwhile."""

    spec: str                       # as typed: glm-4.7-fp8, glm-4.7-fp8@3, glm-4.7-fp8@1a2b3c4d5e6f
    model: str                      # the model's directory (models/<model>)
    digests: frozenset[str]
    whole: bool                     # NAME alone: every bundle the model holds or names


@dataclass
class Removal:
    """What `cache rm` removes, or would: the bundles and refs that go, then every path in the
    order it is removed, with the bytes its removal frees (a blob counts once, not once per
    snapshot that links it). `failed`: paths still there after the removal. `rescued`: the
    rescued dirs that go (`cache rm --rescued`), as they were when planned."""

    bundles: list[dict]             # model, digest, layers, refs, version, path
    refs: list[tuple[str, str, str]]  # (model, ref, digest)
    paths: list[tuple[Path, int]]
    failed: list[Path]
    rescued: list[Rescued] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Freed (or, planned, to be freed): a path still there after the removal frees nothing."""
        failed = set(self.failed)
        return sum(n for p, n in self.paths if p not in failed)


def resolve_removal(cache: Cache, specs: Iterable[str]) -> list[Target]:
    """NAME (the whole model) or NAME@REF (one bundle: a version as in `pull NAME@3`, an alias,
    or a digest, whole or its first 6+ hex digits, sha256: optional) for each spec.

    Raises NotFound (saying what is cached for that name, and `oscar-zoo cache ls`) or
    InvalidInput, naming every bad spec once all are checked; resolving removes nothing."""
    targets, errors = [], []
    for spec in specs:
        try:
            targets.append(_resolve(cache, spec))
        except (NotFound, InvalidInput) as e:
            errors.append(e)
    _raise_all(errors)
    return targets


def _raise_all(errors: list[Exception]) -> None:
    """One error for every bad argument, each named: a user fixes them in one go."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise type(errors[0])(f"{len(errors)} arguments name nothing in the cache, so nothing "
                              "was removed: " + " | ".join(str(e) for e in errors))


def _resolve(cache: Cache, spec: str) -> Target:
    # not at the top: sources import this module
    from .sources.base import nothing_after_at, parse_spec

    name, at, ref = spec.strip().rpartition("@")
    if not at:
        name, ref = spec.strip(), ""
    elif not ref:
        raise nothing_after_at(spec, name, "to remove the whole model",
                               f"{name}@VERSION, @ALIAS or @DIGEST")
    digest_prefix = ref[len("sha256:"):].lower() if ref.lower().startswith("sha256:") else None
    parsed = None
    if digest_prefix is None:
        try:
            name, parsed = parse_spec(spec)   # pull's syntax: NAME, NAME@3, NAME@v3, NAME@alias
        except InvalidInput:
            if not name:
                raise
    elif not name:
        raise InvalidInput(f"{spec!r} has no model name; use NAME@sha256:DIGEST")
    mdir = _cached_model_dir(cache, name)
    model = mdir.name
    named = _digests_named(cache, mdir)
    if not ref:
        return Target(spec, model, frozenset(named), True)
    refs = cache.refs(model)
    if digest_prefix is None and ref in refs:
        # the ref as `cache ls` lists it, ours or made by hand (v3:draft, Draft): that very
        # ref, before pull's syntax folds its case (Draft would name a `draft` beside it)
        return Target(spec, model, frozenset({refs[ref]}), False)
    if digest_prefix is None and parsed is None:
        raise _not_cached(AliasNotFound, spec, cache, mdir)
    if digest_prefix is None and parsed.alias and parsed.alias in refs:
        return Target(spec, model, frozenset({refs[parsed.alias]}), False)
    if digest_prefix is None and parsed.version is not None:
        found = {refs[r] for r in parsed.cache_refs() if r in refs}
        found = found or {d for d in named
                          if cache.read_meta(model, d).get("version") == parsed.version}
        if len(found) == 1:
            return Target(spec, model, frozenset(found), False)
        if found:
            raise InvalidInput(f"{spec!r}: {len(found)} bundles cached for {model} say they are "
                               f"v{parsed.version} ({', '.join(sorted(d[:12] for d in found))}); "
                               f"name one by digest: {name}@DIGEST")
    # as typed: a prefix of decimal digits (0123456789ab) reads as a version number to parse_spec
    hexed = digest_prefix if digest_prefix is not None else ref.lower()
    if len(hexed) >= 6 and all(c in "0123456789abcdef" for c in hexed):
        found = {d for d in named if d.startswith(hexed)}
        if len(found) == 1:
            return Target(spec, model, frozenset(found), False)
        if len(found) > 1:
            raise InvalidInput(f"{spec!r}: {hexed} is the start of {len(found)} digests cached "
                               f"for {model} ({', '.join(sorted(d[:12] for d in found))}); give "
                               "more of it")
    error = (VersionNotFound if digest_prefix is None and parsed.version is not None
             else BundleNotFound if digest_prefix is not None else AliasNotFound)
    raise _not_cached(error, spec, cache, mdir)


def _not_cached(error: type[NotFound], spec: str, cache: Cache, mdir: Path) -> NotFound:
    return error(f"{spec!r} is not in the cache ({cache.root}): {_cached_for(cache, mdir)}. "
                 "`oscar-zoo cache ls` lists every cached bundle")


def _cached_model_dir(cache: Cache, name: str) -> Path:
    """models/<key> for a name as typed (its directory name, as `cache ls` shows it, or any name
    pull takes: hub id, catalog alias); never a link, never a path outside the cache."""
    import difflib

    from .catalog import find, suggest

    models = cache.root / "models"
    entry = find(name)
    keys = [model_key(name)] + ([model_key(entry.name)] if entry is not None else [])
    keys.append(model_key(cache.model_named(name)))     # a registry-only model by its hub id
    for key in keys:
        mdir = models / key
        if mdir.is_symlink():
            raise UnsafePathError(f"{mdir} is a link, which oscar-zoo never makes: not following "
                                  "it; remove it by hand if it is not wanted")
        if mdir.is_dir():
            return mdir
    cached = [p.name for p in model_dirs(cache)]
    close = [c for c in suggest(name) if model_key(c) in cached]
    close += [c for c in difflib.get_close_matches(model_key(name), cached, n=3, cutoff=0.6)
              if c not in close]
    have = f"cached models: {', '.join(cached)}" if cached else "the cache holds no model"
    raise ModelNotFound(f"{name!r} is not in the cache ({cache.root}); {have}. `oscar-zoo cache "
                        "ls` lists every cached bundle.", suggestions=close[:3])


def _digests_named(cache: Cache, mdir: Path) -> set[str]:
    """Every bundle digest a model directory holds or names: snapshots, --layers parts, refs,
    meta, the RotationZoo import index."""
    named = {p.name for p in _entries(mdir / "snapshots")}
    named |= {p.name for p in _entries(mdir / "partial")}
    named |= {p.stem for p in _entries(mdir / "meta") if p.suffix == ".json"}
    named |= set(cache.refs(mdir.name).values())
    for p in _entries(mdir / "imports"):
        named.add(_read_digest(p) or "")
    return {d for d in named if is_sha256(d)}


def _cached_for(cache: Cache, mdir: Path) -> str:
    """What is cached for a model, as an error message says it: bundles with their refs."""
    refs = cache.refs(mdir.name)
    rows = []
    for d in sorted(_digests_named(cache, mdir)):
        names = [r for r, v in refs.items() if v == d]
        version = cache.read_meta(mdir.name, d).get("version")
        if names or (mdir / "snapshots" / d).is_dir() or (mdir / "partial" / d).is_dir():
            rows.append(f"{d[:12]}" + (f" v{version}" if version is not None else "")
                        + (f" (refs {', '.join(names)})" if names else ""))
    if not rows:
        return f"nothing is cached for {mdir.name}"
    return f"cached for {mdir.name}: {'; '.join(rows)}"


def remove(cache: Cache, targets: list[Target], dry_run: bool = False,
           only: set[Path] | None = None) -> Removal:
    """Remove the targets' bundles: their refs first (so nothing finds a bundle that is going
    by its name), then each snapshot and --layers part (renamed aside, then deleted), their meta
    and import index entries (the whole model directory once nothing of the model is left),
    then the exports and blobs no bundle left anywhere in the cache uses. Blobs shared with
    other bundles stay.

    Holds gc.lock exclusively, as prune does: waits for pulls in progress, and no pull starts
    until it is done. Each step leaves a cache that prune can finish. `only`: remove no more
    than these paths (and what lies under them), the plan a user confirmed; refs to a bundle
    that goes always go with it."""
    if not cache.root.exists():
        return Removal([], [], [], [])
    with cache.gc_guard(exclusive=True):
        plan = _plan_removal(cache, targets)
        if only is not None:
            plan.paths = [(p, n) for p, n in plan.paths if only & {p, *p.parents}]
            plan.refs = [r for r in plan.refs if _ref_goes(cache, r, {p for p, _ in plan.paths})]
        if not dry_run:
            for model in sorted({m for m, _, _ in plan.refs}):
                drop_refs(cache, model, [r for m, r, _ in plan.refs if m == model])
            plan.failed = [p for p, _ in plan.paths if not _removed(cache, p)]
            # a model can lose its last bundle to a plan that did not name its directory (the
            # plan confirmed before another removal took the rest)
            drop_emptied_model_dirs(cache, [p for p, _ in plan.paths] + [
                cache.root / "models" / model / "refs" for model, _, _ in plan.refs])
    return plan


def _removed(cache: Cache, path: Path) -> bool:
    """_delete, with a file that will not go (an unlink refused) reported as a directory that
    will not go is: in `failed`, the rest of the plan still done."""
    try:
        return _delete(cache, path)
    except OSError:
        return not os.path.lexists(path)


def _ref_goes(cache: Cache, ref: tuple[str, str, str], going: set[Path]) -> bool:
    """Whether a ref goes with the paths that do: with its bundle, or when it names nothing held."""
    model, _, digest = ref
    mdir = cache.root / "models" / model
    held = [mdir / "snapshots" / digest, mdir / "partial" / digest]
    return mdir in going or any(p in going for p in held) or not any(map(os.path.lexists, held))


def _plan_removal(cache: Cache, targets: list[Target]) -> Removal:
    doomed: dict[str, set[str]] = {}
    for t in targets:
        doomed.setdefault(t.model, set()).update(t.digests)
    models = cache.root / "models"
    bundles: list[dict] = []
    refs: list[tuple[str, str, str]] = []
    paths: list[Path] = []
    gone: set[tuple[str, str]] = set()
    for model, digests in sorted(doomed.items()):
        mdir = models / model
        if mdir.is_symlink() or not mdir.is_dir():  # removed since it was resolved
            continue
        model_refs = cache.refs(model)
        for h in cache.held(model):
            if h.digest in digests:
                bundles.append({"model": model, "digest": h.digest, "layers": h.layers,
                                "refs": [r for r, d in model_refs.items() if d == h.digest],
                                "version": cache.read_meta(model, h.digest).get("version"),
                                "path": str(h.path)})
        refs += [(model, r, d) for r, d in model_refs.items() if d in digests]
        gone |= {(model, d) for d in digests}
        # bundle by bundle, each snapshot in one rename, even when the whole model goes: a
        # confirmed plan (`only`) still names them if the model gained or lost a bundle since
        for d in sorted(digests):
            paths += [p for p in (mdir / "snapshots" / d, mdir / "partial" / d,
                                  mdir / "meta" / f"{d}.json") if os.path.lexists(p)]
        paths += [p for p in _entries(mdir / "imports") if _read_digest(p) in digests]
        if not _digests_named(cache, mdir) - digests:   # nothing of the model is left: all of it
            paths.append(mdir)
    left = {(m.name, d) for m in model_dirs(cache) for d in _digests_named(cache, m)} - gone
    still = {d for _, d in left}
    paths += [cache.root / "exports" / d for d in sorted({d for _, d in gone} - still)
              if os.path.lexists(cache.root / "exports" / d)]
    links = _links(paths)
    for sha in sorted(_blobs_of(cache, gone) - _blobs_of(cache, left)):
        blob = cache.blob(sha)
        try:
            st = blob.lstat()
        except FileNotFoundError:
            continue
        # a hard link outside what goes (a bundle whose meta is lost, a staging dir) still uses it
        if st.st_nlink <= 1 + links.get((st.st_dev, st.st_ino), 0):
            paths.append(blob)
    return Removal(bundles, refs, _freed(paths), [])


# --- rescued bundles ---------------------------------------------------------------------------

def resolve_rescued(cache: Cache, names: Iterable[str]) -> list[Rescued]:
    """The rescued bundles named by their directory under rescued/ (calibrate-<time>-<random>,
    as `oscar-zoo cache ls` shows it). None named: every one `unnamed_goes` lets go.

    Raises UnsafePathError for a name that is a path (it must never reach outside rescued/),
    NotFound for one that names nothing there, naming every bad name once all are checked;
    resolving removes nothing."""
    names = list(names)
    if not names:
        return [r for r in cache.rescued_bundles(empty=True) if unnamed_goes(r)]
    held = {r.name: r for r in cache.rescued_bundles()}
    found, errors = [], []
    for name in names:
        try:
            found.append(_rescued(cache, held, name))
        except (NotFound, InvalidInput) as e:
            errors.append(e)
    _raise_all(errors)
    return list(dict.fromkeys(found))       # a name given twice goes once


def unnamed_goes(r: Rescued) -> bool:
    """Whether `cache rm --rescued` with no name removes it: a saved bundle, yes. A dir with
    no bundle (a calibrate killed, or one still writing that predates its lock) or an empty
    calibrate-* dir (a bundle moved out, or a fresh mkdtemp about to be filled) only once
    nothing has been written to it for _LEFTOVER_AGE, as prune ages out staging dirs. Never
    one it cannot read: another user's, whether whole or not unknown; naming it tries."""
    if r.kind == "saved":
        return True
    if r.kind == "unreadable" or (r.kind == "empty" and not r.name.startswith("calibrate-")):
        return False
    return time.time() - r.touched > _LEFTOVER_AGE


def _rescued(cache: Cache, held: dict[str, Rescued], name: str) -> Rescued:
    name = name.strip()
    # one name, never a path: "../models", "/home/me", "a/../../x", "d:x" on Windows
    if not name or name.startswith(".") or any(c in name for c in "/\\:\x00"):
        raise UnsafePathError(f"{name!r} is not the name of a rescued bundle: give the name "
                              "`oscar-zoo cache ls` shows under RESCUED (calibrate-<time>-<random>, "
                              f"a directory in {cache.rescued}), not a path")
    path = cache.rescued / name
    if path.is_symlink():
        raise UnsafePathError(f"{path} is a link, which oscar-zoo never makes: not following it; "
                              "remove it by hand if it is not wanted")
    if name in held:
        return held[name]
    have = f"rescued: {', '.join(held)}" if held else "the cache holds no rescued bundle"
    raise BundleNotFound(f"{name!r} is not a rescued bundle in {cache.rescued}; {have}. "
                         "`oscar-zoo cache ls` lists them")


def remove_rescued(cache: Cache, rescued: list[Rescued], dry_run: bool = False) -> Removal:
    """Remove rescued dirs as these records say they were (resolve_rescued's, or the plan a
    user confirmed): each listed again under the lock, and one that changed since (a calibrate
    finished writing it, a bundle was moved out or in) or went stays. Each is renamed aside into
    tmp/ and deleted there as a snapshot is (cache._delete): a user moving a bundle out meanwhile
    gets it whole or not at all; an empty one is rmdir'd, which never removes a file.

    Holds gc.lock exclusively: a calibrate holds it shared from making its rescued dir to its
    bundle's last file (calibrate_cmds._rescue), so none is written meanwhile, and this waits
    for one in progress. rescued/ itself goes too once nothing is left in it, under the same
    lock; a calibrate's next rescue makes it again, under the lock too."""
    if not cache.root.exists():
        return Removal([], [], [], [])
    with cache.gc_guard(exclusive=True):
        now = {r.name: r for r in cache.rescued_bundles(empty=True)}
        going = [r for r in rescued if now.get(r.name) == r]
        plan = Removal([], [], _freed([r.path for r in going]), [], going)
        if not dry_run:
            plan.failed = [r.path for r in going if not _rescued_removed(cache, r)]
            # rmdir takes it only empty and never a link: a dir kept (another user's, a fresh
            # mkdtemp, one that would not go) keeps it
            _rmdir_if_empty(cache.rescued)
    return plan


def _rescued_removed(cache: Cache, r: Rescued) -> bool:
    """_removed; an empty dir by rmdir, which fails rather than take what was put in it."""
    if r.kind == "empty":
        _rmdir_if_empty(r.path)
        return not os.path.lexists(r.path)
    return _removed(cache, r.path)
