"""What a source resolves to: a Plan (files to fetch, digest if known, refs to record)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from ..errors import InvalidInput, RemoteError
from ..files import is_sha256
from .download import RemoteFile

DEFAULT_ALIASES = ("recommended", "latest")
_VERSION = re.compile(r"^v?(\d+)$")
_ALIAS = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Ref:
    """What follows `@` in NAME@REF: a version number, an alias, or nothing (the default)."""

    version: int | None = None
    alias: str | None = None
    typed: str | None = field(default=None, compare=False)  # as the user wrote it: 3, v3

    @property
    def is_default(self) -> bool:
        return self.version is None and self.alias is None

    @property
    def label(self) -> str:
        """The ref as messages echo it: as typed (`@3` stays `@3`, not `@v3`)."""
        if self.version is not None:
            return self.typed or f"v{self.version}"
        return self.alias or "default"

    def cache_refs(self) -> tuple[str, ...]:
        """Cache refs that answer this request offline, in order."""
        if self.version is not None:
            return (f"v{self.version}",)
        if self.alias:
            return (self.alias,)
        return DEFAULT_ALIASES + ("rotationzoo",)


def parse_spec(spec: str) -> tuple[str, Ref]:
    """`glm-4.7-fp8`, `glm-4.7-fp8@3`, `glm-4.7-fp8@v3`, `zai-org/GLM-4.7-FP8@recommended`."""
    spec = spec.strip()
    name, at, ref = spec.rpartition("@")
    if not at:
        name, ref = spec, ""
    if not name:
        raise InvalidInput(f"{spec!r} has no model name; use NAME or NAME@VERSION")
    if not ref:
        return name, Ref()
    m = _VERSION.match(ref)
    if m:
        return name, Ref(version=int(m.group(1)), typed=ref)
    if not _ALIAS.match(ref.lower()):
        raise InvalidInput(f"{ref!r} is neither a version number nor an alias (e.g. "
                           f"{name}@3, {name}@recommended)")
    return name, Ref(alias=ref.lower())


@dataclass
class Plan:
    """A source's answer for one (model, ref)."""

    source: str                        # registry | hf | modelscope
    model: str                         # cache name of the model
    origin: str                        # exactly where: URL, or hub:repo/folder@revision
    kind: str                          # "bundle" (our files) | "oscar-pt" (RotationZoo .pt pair)
    digest: str | None = None          # known before download (registry, mirrors)
    version: int | None = None
    refs: list[str] = field(default_factory=list)
    status: str | None = None          # published | draft | yanked
    validated: bool | None = None
    manifest: RemoteFile | bytes | None = None     # "bundle": bundle.json (or its bytes)
    locate: Callable[[str, str, int], RemoteFile] | None = None  # "bundle": name, sha, size
    files: list[RemoteFile] = field(default_factory=list)       # "oscar-pt": k and v files
    import_key: str | None = None      # "oscar-pt": identifies the converted result
    convert: Callable[[dict[str, str]], object] | None = None    # blobs by name -> Bundle
    granularity: str | None = None     # "oscar-pt": layer | kv_head, as the catalog declares it
    partial: Callable[[str], RemoteFile] | None = None  # layer spec -> layers.safetensors
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        # the digest names cache paths (snapshots/<digest>, meta/<digest>.json): a server's word
        # that is not a sha256 must not reach them
        if self.digest is not None and not is_sha256(self.digest):
            raise RemoteError(f"{self.origin}: announced bundle digest {self.digest[:80]!r} is "
                              "not a sha256 hex digest; this source is broken or not to be "
                              "trusted (tell its operator)")
