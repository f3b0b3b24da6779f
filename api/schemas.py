"""Request and response bodies of the /v1 API (they are the OpenAPI schema clients build on)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)   # NaN is not JSON


class Problem(BaseModel):
    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    suggestions: list[str] | None = None


class Geometry(BaseModel):
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    attention_layers: list[int] = []
    head_dim_by_layer: dict[str, int] = {}
    kv_heads_by_layer: dict[str, int] = {}


class ModelItem(BaseModel):
    name: str
    hub_id: str
    architecture: str | None
    aliases: list[str] = Field(description="other names of the model (not version aliases)")
    geometry: Geometry
    geometry_verified: bool
    source: Literal["catalog", "upload"]
    latest_version: int | None
    recommended_version: int | None
    versions_count: int
    validation_passed: bool | None = Field(
        None, description="the validation verdict of the version a bare pull gets (recommended, "
                          "else latest); null without a report")


class ModelList(BaseModel):
    items: list[ModelItem]
    next_cursor: str | None


class VersionSummary(BaseModel):
    version: int
    status: Literal["draft", "published", "yanked"]
    yank_reason: str | None
    digest: str
    size: int
    granularity: str
    key_centering: bool
    clip: dict[str, Any]
    validation_passed: bool | None
    aliases: list[str]
    created_at: str
    created_by: str | None
    source_job: str | None


class ModelDetail(ModelItem):
    version_aliases: dict[str, int] = Field(description="alias -> version number")
    versions: list[VersionSummary] = Field(description="the newest 20; see .../versions for all")


class FileInfo(BaseModel):
    name: str
    sha256: str
    size: int
    url: str = Field(description="path on this registry (stable: names the version number)")


class VersionDetail(BaseModel):
    model: str
    hub_id: str
    version: int
    status: Literal["draft", "published", "yanked"]
    yank_reason: str | None
    yanked_at: str | None
    digest: str = Field(description="sha256 of the canonical bundle.json")
    size: int
    manifest: dict[str, Any]
    validation: dict[str, Any] | None
    files: list[FileInfo]
    aliases: list[str]
    created_at: str
    created_by: str | None
    source_job: str | None


class VersionList(BaseModel):
    items: list[VersionSummary]
    next_cursor: str | None


class AliasInfo(BaseModel):
    alias: str
    version: int
    updated_at: str
    updated_by: str | None


class AliasEventOut(BaseModel):
    alias: str
    from_version: int | None
    to_version: int | None
    at: str
    by: str | None
    reason: str | None


class AliasList(BaseModel):
    model: str
    items: list[AliasInfo]
    history: list[AliasEventOut] = Field(description="every move, newest first (paginated)")
    next_cursor: str | None


class MirrorOut(BaseModel):
    target: str
    repo: str
    path: str | None
    revision: str | None
    url: str | None
    status: str
    error: str | None
    created_at: str
    updated_at: str


class MirrorList(BaseModel):
    items: list[MirrorOut]


class HeadIndex(BaseModel):
    layer: int
    side: Literal["k", "v"]
    kv_head: int
    tensor: str
    byte_range: list[int] = Field(description="[start, end) of this head's rotation in "
                                              "rotations.safetensors (HTTP Range: start-(end-1))")
    clip: float
    eig_min: float | None
    eig_max: float | None
    eig_mean: float | None


class LayerIndexList(BaseModel):
    model: str
    version: int
    granularity: str
    items: list[HeadIndex]


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("may not contain NUL characters")
    return value


NoNul = AfterValidator(_no_nul)


class YankRequest(Strict):
    reason: Annotated[str, NoNul] = Field(min_length=1, max_length=2000)


class AliasRequest(Strict):
    version: int = Field(ge=1, le=2**31 - 1)
    reason: Annotated[str | None, NoNul] = Field(default=None, max_length=2000)
