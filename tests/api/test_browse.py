"""Browsing: list and search models, resolve names and hub ids, versions, pagination, errors."""

from __future__ import annotations

from datetime import datetime

import pytest

from oscar_zoo.zoo.catalog import CATALOG
from tests.utils.bundles import make_bundle


def _publish(server, tmp_path, model="smollm2-135m", seeds=(0,), **kw):
    for seed in seeds:
        make_bundle(tmp_path / f"{model}-{seed}", model=model, seed=seed, **kw)
        server.publish_dir(tmp_path / f"{model}-{seed}", created_by="test")


def test_catalog_is_browsable_without_bundles(registry_server):
    with registry_server.client() as http:
        body = http.get("/v1/models", params={"limit": 200}).json()
    names = [m["name"] for m in body["items"]]
    assert names == sorted(e.name for e in CATALOG)
    glm = next(m for m in body["items"] if m["name"] == "glm-4.7-fp8")
    assert glm["hub_id"] == "zai-org/GLM-4.7-FP8" and "glm-4.7" in glm["aliases"]
    assert glm["geometry"]["num_layers"] == 92 and glm["versions_count"] == 0
    assert glm["latest_version"] is None and body["next_cursor"] is None


def test_search_filters_and_stable_pagination(registry_server, tmp_path):
    _publish(registry_server, tmp_path)
    with registry_server.client() as http:
        def names(**params):
            return [m["name"] for m in http.get("/v1/models", params=params).json()["items"]]

        assert names(q="qwen3-*b") == ["qwen3-30b-a3b", "qwen3-32b", "qwen3-8b"]
        assert names(q="QWEN3.5*") == ["qwen3.5-35b-a3b", "qwen3.5-4b"]
        assert names(q="zai-org/*") == ["glm-4.7-fp8"]          # hub ids match too
        assert names(q="smol") == ["smollm2-135m"]              # a bare word: substring
        assert names(q="100%_") == []                           # LIKE wildcards are literal
        assert names(architecture="qwen3forcausallm") == ["qwen3-32b", "qwen3-4b-thinking-2507",
                                                          "qwen3-8b"]
        assert names(published="true") == ["smollm2-135m"]
        seen, cursor = [], None
        while True:
            page = http.get("/v1/models", params={"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
            seen += [m["name"] for m in page["items"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert seen == sorted(e.name for e in CATALOG)
        bad = http.get("/v1/models", params={"cursor": "!!!"})
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
        assert http.get("/v1/models", params={"limit": 0}).status_code == 422


def test_model_names_aliases_and_hub_ids_resolve(registry_server, tmp_path):
    _publish(registry_server, tmp_path)
    with registry_server.client() as http:
        for name in ("smollm2-135m", "SmolLM2", "smollm2-135m-instruct",
                     "HuggingFaceTB/SmolLM2-135M-Instruct", "huggingfacetb--smollm2-135m-instruct"):
            r = http.get(f"/v1/models/{name}")
            assert r.status_code == 200, name
            assert r.json()["name"] == "smollm2-135m"
        # The hub id works in every sub-resource, slash and all.
        v = http.get("/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct/versions/latest")
        assert v.status_code == 200 and v.json()["version"] == 1
        assert http.get("/v1/models/zai-org/GLM-4.7-FP8").json()["name"] == "glm-4.7-fp8"
        r = http.get("/v1/models/glm-4.8-fp8")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        assert "glm-4.7-fp8" in r.json()["suggestions"]
        assert "Did you mean" in r.json()["detail"]


def test_model_detail_and_versions(registry_server, tmp_path):
    _publish(registry_server, tmp_path, seeds=(0, 1, 2))
    with registry_server.client() as http:
        detail = http.get("/v1/models/smollm2-135m").json()
        assert detail["versions_count"] == 3 and detail["latest_version"] == 3
        assert [v["version"] for v in detail["versions"]] == [3, 2, 1]
        assert detail["version_aliases"] == {"latest": 3}
        page1 = http.get("/v1/models/smollm2-135m/versions", params={"limit": 2}).json()
        page2 = http.get("/v1/models/smollm2-135m/versions",
                         params={"limit": 2, "cursor": page1["next_cursor"]}).json()
        assert [v["version"] for v in page1["items"] + page2["items"]] == [3, 2, 1]
        assert page2["next_cursor"] is None
        # A version number past the integer column's range failed in PostgreSQL (500).
        forged = http.get("/v1/models/smollm2-135m/versions", params={"cursor": "MTA5OTUxMTYyNzc3Ng"})
        assert forged.status_code == 422 and "cursor" in forged.json()["detail"], forged.text
        v = http.get("/v1/models/smollm2-135m/versions/2").json()
        assert v["manifest"]["calibration"]["seed"] == 1
        assert v["created_by"] == "test"
        created = datetime.fromisoformat(v["created_at"].replace("Z", "+00:00"))
        assert created.utcoffset().total_seconds() == 0
        assert [f["url"] for f in v["files"]][0] == "/v1/models/smollm2-135m/versions/2/files/README.md"
        missing = http.get("/v1/models/smollm2-135m/versions/9")
        assert missing.status_code == 404 and "latest" in missing.json()["detail"]
        assert http.get("/v1/models/smollm2-135m/versions/nightly").status_code == 404
        assert http.get("/v1/models/smollm2-135m/versions?status=draft").json()["items"] == []
        assert http.get("/v1/models/smollm2-135m/versions/1/mirrors").json() == {"items": []}


def test_service_routes(registry_server):
    with registry_server.client() as http:
        assert http.get("/v1/health").json()["status"] == "ok"
        assert http.get("/docs").status_code == 200
        spec = http.get("/openapi.json").json()
        assert "/v1/models/{name}/versions/{ref}/files/{filename}" in spec["paths"]
        r = http.delete("/v1/models")
        assert r.status_code == 405 and r.headers["content-type"] == "application/problem+json"
        r = http.get("/v2/anything")
        assert r.status_code == 404 and "/docs" in r.json()["detail"]


@pytest.mark.parametrize("path", ["smollm2-135m/version/1", "smollm2-135m/versions/",
                                  "HuggingFaceTB/SmolLM2-135M-Instruct/layers/0"])
def test_a_mistyped_path_under_a_known_model_says_the_model_exists(registry_server, path):
    """The detail route takes every path no other route took: `.../version/1` answered
    "unknown model 'smollm2-135m/version/1'. Did you mean: smollm2-135m?", about a model that
    exists."""
    with registry_server.client() as http:
        r = http.get(f"/v1/models/{path}")
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        detail = r.json()["detail"]
        assert f"no endpoint at /v1/models/{path}: smollm2-135m is a model" in detail, detail
        assert "/v1/models/smollm2-135m/versions/{version or alias}" in detail
        # a model that does not exist is still one, with its suggestions
        r = http.get("/v1/models/smolm2-135m/versions/")
        assert r.json()["title"] == "Model not found" and "smollm2-135m" in r.json()["suggestions"]
