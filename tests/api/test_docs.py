"""/docs works with no network: every URL its page loads is this server's, and is served.
(FastAPI's default page loads Swagger UI from a CDN; a real browser, offline, is in
tests/api/ui/test_browser.py.)"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

# the types browsers need: a stylesheet served as anything else is ignored, a script may be blocked
TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",),
         ".png": ("image/png",)}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.utils.registry_server import run_registry

    root = tmp_path_factory.mktemp("docs")
    with run_registry(f"sqlite:///{root / 'registry.sqlite'}", root / "data") as server:
        yield server


@pytest.fixture
def http(server):
    with server.client() as client:
        yield client


def loaded_urls(html: str) -> list[str]:
    """Every URL the page makes the browser fetch: src and href attributes, and the spec's."""
    urls = re.findall(r"""\b(?:src|href)\s*=\s*["']([^"']*)["']""", html)
    return urls + re.findall(r"""\burl\s*:\s*["']([^"']*)["']""", html)


def test_docs_page_loads_only_same_origin_assets(http):
    r = http.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = loaded_urls(r.text)
    assert len(urls) >= 4, urls                   # the script, the stylesheet, the icon, the spec
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and url.startswith("/"), url
    assert "http:" not in r.text and "https:" not in r.text and "cdn" not in r.text.lower()
    assert "/openapi.json" in urls


def test_docs_assets_are_served_with_their_types(http):
    assets = [u for u in loaded_urls(http.get("/docs").text) if u.endswith(tuple(TYPES))]
    assert {u.rsplit(".", 1)[1] for u in assets} == {"js", "css", "png"}, assets
    assert all(u.startswith("/") and not u.startswith("//") for u in assets), assets  # no CDN
    for url in assets:
        r = http.get(url)
        assert r.status_code == 200, url
        kind = r.headers["content-type"].split(";")[0]
        assert kind in TYPES["." + url.rsplit(".", 1)[1]], (url, kind)
        assert len(r.content) > 1000, url
    bundle = http.get(next(u for u in assets if u.endswith(".js"))).text
    assert "SwaggerUIBundle" in bundle
    # Swagger UI 4 and older cannot render the OpenAPI 3.1 that FastAPI writes
    assert http.get("/openapi.json").json()["openapi"].startswith("3.1")
    assert re.search(r'PACKAGE_VERSION:"5\.', bundle), "not Swagger UI 5"


def test_docs_keep_their_urls_and_redoc_stays_off(http):
    assert http.get("/docs/oauth2-redirect").status_code == 200
    head = http.head("/docs/assets/swagger-ui.css")
    assert head.status_code == 200 and head.content == b""
    r = http.get("/redoc")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    paths = http.get("/openapi.json").json()["paths"]
    assert not any(p.startswith(("/docs", "/redoc")) for p in paths)     # pages, not API


def test_docs_behind_a_proxy_prefix_load_their_assets_through_it(server):
    """A proxy serving the registry at /zoo/ (root_path): the page must ask for /zoo/... too."""
    from starlette.testclient import TestClient

    page = TestClient(server.app, root_path="/zoo").get("/docs")
    urls = loaded_urls(page.text)
    assert urls and all(u.startswith("/zoo/") for u in urls), urls
    assert "'/zoo/docs/oauth2-redirect'" in page.text
