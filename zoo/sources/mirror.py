"""Our own hub mirrors (zoo/mirror) as a pull source: the repo's oscar-zoo.json index names
each version's folder, digest and tag; the bundle files are fetched at that tag's commit and
checked against the manifest (whose sha256 is the indexed digest)."""

from __future__ import annotations

import json

from ..catalog import CatalogEntry
from ..errors import BundleNotFound, NotFound, RemoteError, VersionNotFound
from .base import Plan, Ref, status_note
from .download import RemoteFile, fetch
from .hubs import hub

INDEX = "oscar-zoo.json"
MANIFEST = "bundle.json"


class MirrorSource:
    def __init__(self, kind: str, repo: str, cache):
        self.name = kind
        self.repo = repo
        self.hub = hub(kind)
        self.cache = cache     # the pull's: its index blob is fetched into it

    def plan(self, entry: CatalogEntry | None, name: str, ref: Ref) -> Plan:
        where = f"{self.name}:{self.repo}"
        branch = "main" if self.name == "hf" else "master"
        listing = self.hub.listing(self.repo, [INDEX], branch)
        if INDEX not in listing.files:
            raise NotFound(f"{where}: no {INDEX}, so this is not an oscar-zoo mirror")
        cache = self.cache
        meta = listing.files[INDEX]
        sha = fetch(self.hub.remote(self.repo, meta, listing.commit or branch, INDEX), cache, False)
        try:
            index = json.loads(cache.blob(sha).read_bytes())
        except ValueError as e:
            raise RemoteError(f"{where}: {INDEX} cannot be read ({e})") from None
        slot = _model_slot(index if isinstance(index, dict) else {}, entry, name)
        if slot is None:
            raise BundleNotFound(f"{where}: the mirror has no {name}")
        model, info = slot
        numbers = _candidates(where, model, info, ref)
        skipped: list[int] = []
        for number in numbers:
            e = _versions(info).get(number)
            if e is None:
                raise VersionNotFound(f"{where}: {model} v{number} is not mirrored; mirrored: "
                                      f"{', '.join(f'v{n}' for n in sorted(_versions(info)))}")
            if not _usable(e):
                raise RemoteError(f"{where}: the index's entry for {model} v{number} is not "
                                  "one oscar-zoo wrote (no tag, folder, digest or file list)")
            names = [n for n in e["files"] if not n.endswith(".pt")]
            paths = [f"{e['path']}/{n}" for n in names]
            at_tag = self._at_tag(paths, e["tag"])
            if at_tag is not None:
                break
            if ref.version is not None:
                raise VersionNotFound(
                    f"{where}: {model} v{number} is listed in the mirror's {INDEX}, but its tag "
                    f"{e['tag']} does not exist: the mirror's last run did not finish (its "
                    f"maintainer's `oscar-zoo mirror {model}@{number}` completes it); pull it "
                    "from another source (OSCAR_ZOO_SOURCES) meanwhile")
            skipped.append(number)
        else:
            raise VersionNotFound(
                f"{where}: the mirror's {INDEX} lists {model} "
                f"{', '.join(f'v{n}' for n in skipped)}, but not one of their tags exists: "
                "the mirror's last runs did not finish (its maintainer's `oscar-zoo mirror` "
                "completes them); pull from another source (OSCAR_ZOO_SOURCES) meanwhile")
        status = "yanked" if e.get("yanked") else "published"
        reason = (e.get("yank_reason") or None) if e.get("yanked") else None
        note = status_note(model, number, status, reason)
        notes = [note] if note else []
        if skipped:
            shown = ", ".join(f"v{n}" for n in skipped)
            verb = "is" if len(skipped) == 1 else "are"
            notes.append(f"{where}: {model} {shown} {verb} listed but not tagged (the mirror's "
                         f"last run did not finish; its maintainer's `oscar-zoo mirror "
                         f"{model}@{skipped[0]}` completes it), so this is v{number}, the "
                         "newest one it serves")
        missing = [p for p in paths if p not in at_tag.files]
        if missing:
            raise BundleNotFound(f"{where}@{e['tag']}: missing {', '.join(missing)}")
        pinned = at_tag.commit or e["tag"]

        def locate(fname: str, sha256: str | None, size: int | None) -> RemoteFile:
            remote = self.hub.remote(self.repo, at_tag.files[f"{e['path']}/{fname}"], pinned, fname)
            remote.sha256, remote.size = sha256 or remote.sha256, size or remote.size
            return remote

        refs = [f"v{number}"] + (["latest"] if ref.version is None else [])
        return Plan(source=self.name, model=model, origin=f"{where}/{e['path']}@{e['tag']}",
                    kind="bundle", digest=e["digest"], version=number, refs=refs,
                    status=status, yank_reason=reason, notes=notes,
                    validated=e.get("validated"), manifest=locate(MANIFEST, e["digest"], None),
                    locate=locate)

    def _at_tag(self, paths: list[str], tag: str):
        """The listing of `paths` at `tag`; None when the tag does not exist (a mirror run
        that stopped between its commit, which indexes the version, and the tag)."""
        try:
            return self.hub.listing(self.repo, paths, tag)
        except (VersionNotFound, NotFound):
            if tag in self.hub.tags(self.repo):
                raise
            return None


def _candidates(where: str, model: str, info: dict, ref: Ref) -> list[int]:
    """The versions that may answer a ref, in order: the one it names, or for the default and
    `latest` every version not yanked, newest first (the first whose tag exists is served; the
    index's own `latest` is not trusted for that: indexes written before yanks were recorded
    lack it). Aliases other than `latest` are the registry's (`recommended` included): a
    mirror does not keep them, and answering one with its latest would hand out another
    version than the registry's without a word, and record it in the cache under that alias."""
    if ref.version is not None:
        return [ref.version]
    if ref.alias not in (None, "latest"):
        raise VersionNotFound(f"{where}: mirrors keep version numbers and `latest` only, not "
                              f"aliases such as {ref.alias!r}, which live in the registry: "
                              f"pull {model}@{ref.alias} from the registry (OSCAR_ZOO_SOURCES="
                              f"registry), or pull {model} (latest) or {model}@N from the mirror")
    versions = _versions(info)
    live = sorted((n for n, e in versions.items() if not e.get("yanked")), reverse=True)
    if not live:
        raise VersionNotFound(_all_yanked(where, model, versions))
    return live


def _all_yanked(where: str, model: str, versions: dict[int, dict]) -> str:
    """Which versions were yanked and why (the newest few), and the ways on: a new version,
    another source, or a yanked one by number (served from its tag, with a warning)."""
    if not versions:
        return f"{where}: the mirror lists no versions of {model}"
    numbers = sorted(versions, reverse=True)
    why = ", ".join(f"v{n} ({versions[n].get('yank_reason') or 'no reason given'})"
                    for n in numbers[:5]) + (f" and {len(numbers) - 5} more" if numbers[5:] else "")
    return (f"{where}: every mirrored version of {model} is yanked: {why}. Wait for a new "
            f"version to be published and mirrored, pull from another source "
            f"(OSCAR_ZOO_SOURCES), or, knowing why it was yanked, pull one by number "
            f"({model}@{numbers[0]})")


def _versions(info: dict) -> dict[int, dict]:
    """A model's versions by number; entries another tool put there (other keys, other
    shapes) are not versions."""
    versions = info.get("versions")
    return {int(n): e for n, e in (versions.items() if isinstance(versions, dict) else ())
            if str(n).isascii() and str(n).isdigit() and isinstance(e, dict)}


def _usable(e: dict) -> bool:
    # files: {name: sha256}, as layout.index_entry writes it
    return (all(isinstance(e.get(k), str) for k in ("tag", "path", "digest"))
            and isinstance(e.get("files"), dict) and all(isinstance(n, str) for n in e["files"]))


def _model_slot(index: dict, entry: CatalogEntry | None, name: str):
    models = index.get("models")
    keys = {name.lower()} | ({entry.name, *entry.names} if entry is not None else set())
    for model, info in (models.items() if isinstance(models, dict) else ()):
        if not isinstance(info, dict):    # another tool's entry
            continue
        if model.lower() in keys or str(info.get("hub_id", "")).lower() in keys:
            return model, info
    return None
