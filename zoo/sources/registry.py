"""The oscar-zoo registry as a pull source: versions, aliases, sha256 per file, layer ranges.

One request resolves a name: the model detail carries the alias map and the newest versions
with their digests, so a warm pull (digest already cached) needs nothing more. Files are then
fetched by their stable per-version URLs and checked against the manifest, whose own sha256 is
the digest announced here.
"""

from __future__ import annotations

from ..catalog import CatalogEntry
from ..errors import VersionNotFound
from ..registry_client import RegistryClient
from ..settings import redact_url
from .base import DEFAULT_ALIASES, Plan, Ref, status_note
from .download import RemoteFile

MANIFEST = "bundle.json"


class RegistrySource:
    name = "registry"

    def __init__(self, client: RegistryClient | None = None):
        self.client = client or RegistryClient()
        # (model, version summaries) of the last model detail read: the status of versions
        # other than the one planned (a yank of one cached earlier), and the answer behind a
        # "no published version", for pull to record in the cache (pull._learn_statuses)
        self.seen: tuple[str, list[dict]] | None = None

    @property
    def where(self) -> str:
        """The registry as pull's warnings name it, with its URL (as the client's own errors
        begin): a file's download error says only "from registry"."""
        return f"registry {self.client.where}"

    def plan(self, entry: CatalogEntry | None, name: str, ref: Ref) -> Plan:
        summary, model = self._resolve(entry.name if entry is not None else name, ref)
        number, digest = int(summary["version"]), summary["digest"]
        client = self.client

        def locate(fname: str, sha256: str | None, size: int | None) -> RemoteFile:
            return RemoteFile(fname, url=client.file_url(model, number, fname), sha256=sha256,
                              size=size, headers=client.auth_headers, source="registry")

        status, reason = summary.get("status"), summary.get("yank_reason")
        note = status_note(model, number, status, reason)
        return Plan(
            source="registry", model=model, kind="bundle", digest=digest, version=number,
            origin=redact_url(client.url(f"/v1/models/{model}/versions/{number}")),
            refs=[f"v{number}", *_cacheable(summary.get("aliases", []))], status=status,
            yank_reason=reason if status == "yanked" else None,
            validated=summary.get("validation_passed"),
            manifest=locate(MANIFEST, digest, None), locate=locate, notes=[note] if note else [],
            partial=lambda spec: RemoteFile("rotations.safetensors",
                                            url=client.layers_url(model, number, spec),
                                            headers=client.auth_headers, source="registry"))

    def _resolve(self, name: str, ref: Ref) -> tuple[dict, str]:
        """(version summary, model name) for the ref, from the model detail when it lists it.
        No OSCAR_ZOO_OFFLINE hint on its errors: pull falls back to the cache by itself."""
        detail = self.client.model(name, cache_hint=False)
        model, aliases = detail["name"], detail.get("version_aliases", {})
        self.seen = (model, list(detail.get("versions", [])))
        where = f"registry {self.client.where}: {model}"
        if ref.version is not None:
            number = ref.version
        elif ref.alias is not None:
            if ref.alias not in aliases:    # the registry's 404 says why (removed when, by whom)
                return self.client.version(model, ref.alias, cache_hint=False), model
            number = aliases[ref.alias]
        else:
            number = next((aliases[a] for a in DEFAULT_ALIASES if a in aliases), None)
            if number is None:
                raise VersionNotFound(f"{where} has no published version (neither "
                                      f"{' nor '.join(DEFAULT_ALIASES)} is set)")
        for summary in detail.get("versions", []):
            if summary["version"] == number:
                return summary, model
        # older than the detail's newest 20
        return self.client.version(model, number, cache_hint=False), model


def _cacheable(aliases) -> list[str]:
    """The aliases a cache ref may be named after: one a registry kept from before v<N> and
    rotationzoo* names were refused would write refs/v3 over version 3's own ref."""
    from ..catalog import ALIAS_NAME

    return [a for a in aliases if isinstance(a, str) and ALIAS_NAME.fullmatch(a)]
