"""The public RotationZoo (oscar-spec 2.12) on the HF Hub and ModelScope, as a pull source.

Its `.pt` pairs are downloaded whole (sha256 from the hub listing), read only with
torch.load(weights_only=True) (zoo.interop.oscar_pt; this cold path imports torch, a warm pull
never does), converted to a canonical bundle by
zoo.interop.convert with the model's shipped serving settings, and marked as imported: no
validation report unless one is run. The conversion is cached by an import key that hashes the
two files, so a warm pull of an unchanged zoo entry converts nothing.
"""

from __future__ import annotations

import hashlib
import json

from .. import __version__, settings
from ..catalog import CatalogEntry
from ..errors import BundleNotFound, ModelNotFound, OfflineError, RemoteError, VersionNotFound
from .base import Plan, Ref
from .hubs import Listing, hub

ZOO_REPO_SETTING = {"hf": "hf_zoo_repo", "modelscope": "modelscope_zoo_repo"}


def serving_of(entry: CatalogEntry) -> dict:
    """OSCAR's shipped settings for this model (the .pt files hold none), without importing
    the interop module (numpy, pydantic) on the warm path."""
    return {"k_clip": entry.k_clip, "v_clip": entry.v_clip, "group_size": entry.group_size,
            "sink_tokens": entry.sink_tokens, "recent_tokens": entry.recent_tokens}


class RotationZooSource:
    # its "not found" comes from the catalog, before any network: it never holds a published
    # bundle, so it says nothing against a cached one (pull's fallback when the registry is down)
    answers_from_catalog = True

    def __init__(self, kind: str, repo: str | None = None):
        self.name = kind
        self.hub = hub(kind)
        self.repo = repo or settings.get(ZOO_REPO_SETTING[kind])

    def plan(self, entry: CatalogEntry | None, name: str, ref: Ref) -> Plan:
        where = f"{self.name}:{self.repo}"
        if entry is None:
            raise ModelNotFound(f"{where}: the catalog has no model {name!r}, so the RotationZoo "
                                "has none either")
        if entry.zoo is None:
            raise BundleNotFound(f"{where}: the RotationZoo has no rotations for {name}")
        if ref.version is not None:
            raise VersionNotFound(
                f"{where}: the RotationZoo has no numbered versions ({name}@{ref.version}); it "
                "holds one shipped calibration per model. Numbered versions come from the "
                "registry (OSCAR_ZOO_ENDPOINT) or our mirrors.")
        if ref.alias not in (None, "recommended", "latest"):
            raise VersionNotFound(f"{where}: the RotationZoo has no alias {ref.alias!r}")
        zoo = entry.zoo
        revision = "main" if self.name == "hf" else "master"
        k_path, v_path = f"{zoo.folder}/{zoo.k_file}", f"{zoo.folder}/{zoo.v_file}"
        listing = self._listing([k_path, v_path], revision)
        for p in (k_path, v_path):
            if p not in listing.files:
                raise BundleNotFound(f"{where}@{listing.commit or revision}: no file {p}")
        pinned = listing.commit or revision
        imported_from = f"{self.name}:{self.repo}/{zoo.folder}@{pinned}"
        k_meta, v_meta = listing.files[k_path], listing.files[v_path]
        files = [self.hub.remote(self.repo, k_meta, pinned, zoo.k_file),
                 self.hub.remote(self.repo, v_meta, pinned, zoo.v_file)]
        notes = []
        if self.name == "modelscope":
            notes.append("ModelScope lists the zoo by branch name only; the files are pinned by "
                         "their sha256")
        return Plan(source=self.name, model=entry.name, origin=imported_from, kind="oscar-pt",
                    refs=["rotationzoo"], files=files, notes=notes,
                    granularity="kv_head" if zoo.per_head else "layer",
                    import_key=import_key(self.repo, zoo.folder, k_meta, v_meta, entry),
                    convert=lambda blobs: _convert(blobs, entry, imported_from,
                                                   self._dated(listing, [k_path, v_path])))

    def _listing(self, paths: list[str], revision: str) -> Listing:
        quick = self.hub.head_listing(self.repo, paths, revision) if self.name == "hf" else None
        return quick or self.hub.listing(self.repo, paths, revision)

    def _dated(self, listing: Listing, paths: list[str]) -> Listing:
        """The conversion stamps the commit date (so the same files give the same digest);
        a quick listing has none, so the cold path asks for it at the pinned commit. The files
        are verified by then: without a date the import still stands, stamped with the time
        of conversion, as ModelScope's imports are."""
        if listing.date or listing.commit is None:
            return listing
        try:
            return self.hub.listing(self.repo, paths, listing.commit)
        except (RemoteError, OfflineError):
            return listing


def import_key(repo: str, folder: str, k_meta, v_meta, entry: CatalogEntry) -> str:
    ident = {"repo": repo, "folder": folder, "model": entry.name, "converter": __version__,
             "k": k_meta.sha256 or k_meta.git_sha1, "v": v_meta.sha256 or v_meta.git_sha1,
             "serving": serving_of(entry)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _convert(blobs: dict, entry: CatalogEntry, imported_from: str, listing: Listing):
    """blobs: {"k": path, "v": path} of the verified .pt files -> an (unwritten) Bundle."""
    from ..interop.convert import ServingDefaults, bundle_from_oscar
    from ..interop.oscar_pt import read_file

    zoo = entry.zoo
    k = read_file(blobs["k"])
    v = read_file(blobs["v"])
    bundle = bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), imported_from,
                               tag=zoo.tag or zoo.folder)
    if listing.date:  # the commit date, so the same files always give the same digest
        cal = bundle.manifest.calibration.model_copy(update={"created_at": listing.date})
        bundle.manifest = bundle.manifest.model_copy(update={"calibration": cal})
    return bundle
