"""What a source resolves to: a Plan (files to fetch, digest if known, refs to record)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from ..catalog import version_number
from ..errors import InvalidInput, RemoteError
from ..files import is_sha256
from .download import RemoteFile

DEFAULT_ALIASES = ("recommended", "latest")
# what may follow `@` as an alias (lower-cased first): wider than the registry's rule for new
# aliases (catalog.ALIAS_NAME), so that a ref no alias can match is the registry's "not found,
# these exist" rather than a parse error
ALIAS_REF = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


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
    """`glm-4.7-fp8`, `glm-4.7-fp8@3`, `glm-4.7-fp8@v3`, `zai-org/GLM-4.7-FP8@recommended`.

    `NAME@` is refused, not read as NAME: a ref lost on its way (`NAME@$VERSION` with VERSION
    unset) must not pull the default version instead of the one a script meant."""
    spec = spec.strip()
    name, at, ref = spec.rpartition("@")
    if not at:
        name, ref = spec, ""
    if not name:
        raise InvalidInput(f"{spec!r} has no model name; use NAME or NAME@VERSION")
    if at and not ref:
        raise nothing_after_at(spec, name, "for its default version (recommended, else latest)",
                               f"{name}@VERSION or @ALIAS")
    if not ref:
        return name, Ref()
    number = version_number(ref.lower())     # V3 too, as the registry reads it
    if number is not None:
        return name, Ref(version=number, typed=ref)
    if not ALIAS_REF.match(ref.lower()):
        raise InvalidInput(f"{ref!r} is neither a version number nor an alias (e.g. "
                           f"{name}@3, {name}@recommended)")
    return name, Ref(alias=ref.lower())


def nothing_after_at(spec: str, name: str, alone: str, forms: str) -> InvalidInput:
    """The error for `NAME@` with no ref, in the words `cache rm` uses: `alone` says what NAME
    by itself means to the command, `forms` the refs it takes."""
    return InvalidInput(f"{spec!r} names no bundle after '@': give {name} alone {alone}, "
                        f"or {forms}")


def status_note(model: str, version: int | None, status: str | None,
                yank_reason: str | None = None) -> str | None:
    """What a bundle's status warns of (a yanked or draft version), in the same words whether a
    source just said it or the cache's record of it does (an offline pull, export); None for a
    published one or one with no status (a RotationZoo import)."""
    which = f"version {version} of {model}" if version is not None else model
    if status == "yanked":
        return f"{which} was yanked: {yank_reason or 'no reason given'}"
    if status == "draft":
        return f"{which} is a draft, not published"
    return None


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
    yank_reason: str | None = None     # the source's word on why, when yanked
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
