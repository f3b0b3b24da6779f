"""The web UI's pages over real HTTP (SQLite and PostgreSQL): same data as the JSON API, charts
that encode the bundle's own tensors, HTML errors, job pages and the job event stream.

Charts are checked by decoding the SVG back into a grid and comparing it with values computed
here, independently, from the bundle files (safetensors + bundle.json)."""

from __future__ import annotations

import html
import json
import re
import threading
import time
import xml.etree.ElementTree as ET

import numpy as np
from oscar_zoo.api.ui.charts import PALETTE
from oscar_zoo.zoo.recipes import sglang_recipe
from safetensors.numpy import load_file

from tests.api.ui.conftest import add_job, update_job

SVG = re.compile(r"<svg .*?</svg>", re.S)
RUN = re.compile(r"M(\d+) (\d+)h(\d+)v1h-\d+z")
LEVELS = 16
NS = "{http://www.w3.org/2000/svg}"


def model_names(page: str) -> list[str]:
    return re.findall(r'<th scope="row"><a href="/models/([^"/]+)">', page)


def charts(page: str) -> dict[str, ET.Element]:
    """aria-label -> parsed <svg> (parsing proves each chart is well-formed XML)."""
    out = {}
    for raw in SVG.findall(page):
        root = ET.fromstring(raw)
        out[root.get("aria-label")] = root
    return out


def decode_grid(svg: ET.Element, shape: tuple[int, int]) -> np.ndarray:
    """The colour level of every cell of a heatmap (-1 where nothing is drawn)."""
    grid = np.full(shape, -1)
    for g in svg.iter(f"{NS}g"):
        for p in g.iter(f"{NS}path"):
            for x, y, n in RUN.findall(p.get("d")):
                grid[int(y), int(x):int(x) + int(n)] = PALETTE.index(p.get("fill"))
    return grid


def levels(values: np.ndarray) -> np.ndarray:
    """Independent quantization: 16 equal bins between the min and the max."""
    lo, hi = np.nanmin(values), np.nanmax(values)
    return np.minimum(np.floor((values - lo) / (hi - lo) * LEVELS), LEVELS - 1).astype(int)


def test_home_search_and_filters(seeded):
    with seeded.server.client() as http:
        for query in ("", "?q=smol", "?q=qwen3*", "?architecture=LlamaForCausalLM"):
            page = http.get("/" + query)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            api = http.get("/v1/models" + query.replace("?", "?limit=50&") if query else "/v1/models?limit=50")
            assert model_names(page.text) == [m["name"] for m in api.json()["items"]]
        assert model_names(http.get("/?q=smol").text) == ["smollm2-135m"]
        assert model_names(http.get("/?validated=true").text) == ["qwen3.5-4b", "smollm2-135m"]
        assert model_names(http.get("/?validated=true&q=glm").text) == []
        home = http.get("/").text
        assert '<title>Models · oscar-zoo</title>' in home and 'role="search"' in home
        row = home[home.index('href="/models/smollm2-135m"'):]
        assert 'href="/models/smollm2-135m/versions/2">v2</a>' in row[:800]      # recommended
        assert "recommended" in row[:900] and "passed" in row[:1200]


def test_model_page_matches_api(seeded):
    with seeded.server.client() as http:
        page = http.get("/models/smollm2-135m").text
        versions = http.get("/v1/models/smollm2-135m/versions").json()["items"]
        shown = re.findall(r'href="/models/smollm2-135m/versions/(\d+)">v\d+</a></th>\s*<td><span '
                           r'class="badge status-(\w+)"', page)
        assert shown == [(str(v["version"]), v["status"]) for v in versions]
        detail = http.get("/v1/models/smollm2-135m/versions/recommended").json()
        assert detail["version"] == 2 and "Use version 2" in page
        for variant in detail["validation"]["variants"]:
            assert f"{variant['delta_nll']:+.4f}" in page and f"{variant['kl']:.4f}" in page
        assert "oscar-zoo pull smollm2-135m@2 --format sglang --out rotations/" in page
        recipe = sglang_recipe(detail["manifest"], "rotations/k_rotation_qqt_r_h_pbr.pt",
                               "rotations/v_rotation_sst_r_h_pbr.pt")
        assert html.escape(recipe.shell(), quote=False) in page
        assert "best of the three" in page                        # alias history
        moved = http.get("/models/HuggingFaceTB/SmolLM2-135M-Instruct", follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == "/models/smollm2-135m"


def test_version_page_charts_encode_the_tensors(seeded):
    with seeded.server.client() as http:
        r = http.get("/models/smollm2-135m/versions/3")
        assert r.status_code == 200 and float(r.headers["server-timing"].split("dur=")[1]) > 0
        found = charts(r.text)
    tensors = load_file(str(seeded.bundles[("smollm2-135m", 3)] / "rotations.safetensors"))
    manifest = json.loads((seeded.bundles[("smollm2-135m", 3)] / "bundle.json").read_text())
    layers = list(range(30))
    # K spectrum: per-head eigenvalues, sorted largest first, log10, mean over heads.
    eig = np.stack([tensors[f"k.{i}.eigenvalues"].astype(np.float64) for i in layers])  # [L, h, d]
    spectrum = np.log10(-np.sort(-eig, axis=-1)).mean(axis=1)                           # [L, d]
    grid = decode_grid(found["K (keys): eigenvalue spectrum per layer"], spectrum.shape)
    np.testing.assert_array_equal(grid, levels(spectrum))
    # Clip grid: one colour scale over K and V.
    clips = np.stack([np.stack([tensors[f"{s}.{i}.clip"] for i in layers]) for s in "kv"])
    want = levels(clips.astype(np.float64))                                           # [2, L, h]
    for side, name in enumerate(("K (keys)", "V (values)")):
        got = decode_grid(found[f"{name}: clip ratio per layer and KV head"], (30, 3))
        np.testing.assert_array_equal(got, want[side])
    # Attention-error bars: heights proportional to the validation report's numbers.
    bars = found["Attention output error per layer, relative to BF16 (lower is better)"]
    heights = {}
    for path in bars.iter(f"{NS}path"):
        heights[path.get("fill")] = [-float(h) for h in re.findall(r"v(-[\d.]+)h", path.get("d"))]
    by_name = {v["name"]: v["per_layer_attn_rel_error"] for v in manifest["validation"]["variants"]}
    got = np.array(list(heights.values()))                                  # [variants, L] px
    want = np.array([by_name[n] for n in ("bundle", "bundle-served", "oscar-shipped", "hadamard", "naive")])
    scale = (got * want).sum() / (want * want).sum()                        # px per unit error
    np.testing.assert_allclose(got, want * scale, atol=0.1)                 # drawn to 0.1 px


def test_hybrid_model_charts_use_global_layer_ids(seeded):
    with seeded.server.client() as http:
        page = http.get("/models/qwen3.5-4b/versions/1").text
    spectrum = charts(page)["V (values): eigenvalue spectrum per layer"]
    ticks = [t.text for t in spectrum.iter(f"{NS}text")]
    assert "3" in ticks and "31" in ticks and "0" in ticks  # layer ids 3..31 and rank 0


def test_errors_render_as_html(seeded):
    with seeded.server.client() as http:
        r = http.get("/models/smolm2-135m")
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert 'href="/models/smollm2-135m"' in r.text and "<title>Model not found" in r.text
        r = http.get("/models/smollm2-135m/versions/99")
        assert r.status_code == 404 and "recommended" in r.text
        r = http.get("/?cursor=not-a-cursor")
        assert r.status_code == 422 and "cursor" in r.text
        assert http.get("/jobs?status=bogus").status_code == 422
        assert http.get("/jobs/does-not-exist").status_code == 404


def test_pages_are_light_and_offline(seeded):
    with seeded.server.client() as http:
        for path, most in (("/", 40_000), ("/models/smollm2-135m", 40_000),
                           ("/models/smollm2-135m/versions/3", 150_000), ("/jobs", 20_000)):
            page = http.get(path).text
            assert len(page.encode()) < most, (path, len(page))
            assets = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', page)
            assert assets and all(a.startswith("/static/") for a in assets), assets
        for asset in ("/static/style.css", "/static/app.js"):
            r = http.get(asset)
            assert r.status_code == 200 and len(r.content) < 8_000


def test_job_pages(seeded):
    server = seeded.server
    running = add_job(server, progress={"phase": "pass1", "done": 12, "total": 30, "layer": 11})
    done = add_job(server, status="succeeded", phase="publishing", result_version_id=None)
    shown = lambda page: re.findall(r'href="/jobs/([0-9a-f-]{36})"><code>.*?status-(\w+)', page, re.S)
    with server.client() as http:
        for query in ("", "?status=succeeded", "?model=smollm2", "?model=qwen3-8b"):
            api = http.get("/v1/jobs" + query).json()["items"]
            assert shown(http.get("/jobs" + query).text) == [(j["id"], j["status"]) for j in api]
        assert len(shown(http.get("/jobs?model=smollm2").text)) == 2     # an alias of the model
        assert shown(http.get("/jobs?status=succeeded").text) == [(done, "succeeded")]
        page = http.get(f"/jobs/{running}").text
        assert 'value="12"' in page and "layer 11" in page and "test-worker" in page
        assert f'data-events="/v1/jobs/{running}/events"' in page
        assert f'href="/jobs/{running}">Refresh</a>' in page
        # the short id `oscar-zoo jobs list` shows opens the same page, which names the whole id
        assert f'data-events="/v1/jobs/{running}/events"' in http.get(f"/jobs/{running[:8]}").text
        assert 'data-field="waiting" role="status" hidden' in page       # running: no reason
        queued = add_job(server, status="queued", progress={})
        page = http.get(f"/jobs/{queued}").text
        assert "Cannot start yet: no worker has asked for work" in page


def test_job_list_filters_as_the_form_sends_them_and_links_relative(seeded):
    server = seeded.server
    with server.registry.db.read() as session:
        from oscar_zoo.registry_db import queries
        v2 = queries.resolve_version(session, queries.resolve_model(session, "smollm2-135m"), 2)
        v2_id = v2.id
    old = add_job(server, model=None, status="succeeded", result_version_id=v2_id)  # before 0002
    hub = add_job(server, model="tiny-model", spec={"model": "SomeOrg/Tiny-Model"})
    ids = lambda page: re.findall(r'href="/jobs/([0-9a-f-]{36})"', page)
    with server.client() as http:
        r = http.get("/jobs?status=&model=")                  # the form's defaults: "any"
        assert r.status_code == 200 and {old, hub} <= set(ids(r.text))
        assert http.get("/v1/jobs?status=").status_code == 200
        r = http.get("/v1/jobs?status=done")
        assert r.status_code == 422 and "queued" in r.json()["detail"]
        for model in ("SomeOrg/Tiny-Model", "tiny-model"):   # a hub id files as its repo part
            assert ids(http.get(f"/jobs?status=&model={model}").text) == [hub]
            assert [j["id"] for j in http.get("/v1/jobs", params={"model": model}).json()["items"]] == [hub]
        catalog = add_job(server, model="smollm2-135m", status="queued", progress={})
        assert catalog in ids(http.get("/jobs?model=HuggingFaceTB/SmolLM2-135M").text)
        page = http.get("/jobs?status=succeeded").text      # the version's own model, not None
        assert '<a href="/models/smollm2-135m/versions/2">v2</a>' in page and "/models/None" not in page
        assert '<a href="/models/smollm2-135m/versions/2">smollm2-135m v2</a>' in http.get(f"/jobs/{old}").text
        assert 'href="/v1/jobs?status=succeeded"' in page     # "this page as JSON" keeps the filter
        for _ in range(50):
            add_job(server, status="queued", progress={})
        page = http.get("/jobs", headers={"Host": "backend:8000"}).text
        more = re.search(r'<a href="([^"]+)" rel="next">', page).group(1)
        assert more.startswith("?cursor="), more             # not the backend's host
        cursor = json.dumps(["0001-01-01T00:00:00+01:00", "x"])
        import base64
        forged = base64.urlsafe_b64encode(cursor.encode()).decode().rstrip("=")
        for path in ("/jobs", "/v1/jobs"):
            r = http.get(path, params={"cursor": forged})
            assert r.status_code in (400, 422) and "cursor" in r.text, (path, r.status_code)


def test_job_page_shows_a_pending_cancel_and_timings(seeded):
    server = seeded.server
    job = add_job(server, cancel_requested=True, timings={"pass1": 12.345678})
    with server.client() as http:
        page = http.get(f"/jobs/{job}").text
        assert 'data-field="cancel" class="badge status-cancelled">cancel requested' in page
        assert "<td>12.3 s</td>" in page
        assert "cancel requested</span></td>" in http.get("/jobs").text


def test_job_event_stream_follows_the_row(seeded):
    server = seeded.server
    job = add_job(server)
    events: list[dict] = []

    def writer():
        time.sleep(0.3)
        for done in (10, 20):
            update_job(server, job, progress={"phase": "pass1", "done": done, "total": 30, "layer": done})
            time.sleep(0.8)
        update_job(server, job, status="succeeded", phase="done")

    thread = threading.Thread(target=writer)
    thread.start()
    with server.client() as http, http.stream("GET", f"/v1/jobs/{job}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    thread.join()
    assert [e["progress"]["done"] for e in events[:3]] == [0, 10, 20]
    assert events[-1]["status"] == "succeeded" and all(e["id"] == job for e in events)
    with server.client() as http:
        assert http.get("/v1/jobs/nope/events").status_code == 404


def test_home_json_link_keeps_the_query_the_api_supports(seeded):
    with seeded.server.client() as http:
        page = http.get("/?q=qwen&architecture=Qwen3_5ForConditionalGeneration&validated=true").text
        link = re.search(r'this page as JSON: <a href="([^"]+)">', page).group(1)
        assert html.unescape(link) == "/v1/models?q=qwen&architecture=Qwen3_5ForConditionalGeneration"
        assert model_names(page) == [m["name"] for m in http.get(html.unescape(link)).json()["items"]]
        assert "no validated filter" in page                 # the JSON lists the rest too
        plain = http.get("/?q=smol").text
        assert 'this page as JSON: <a href="/v1/models?q=smol">' in plain
        assert "no validated filter" not in plain
        assert 'this page as JSON: <a href="/v1/models">' in http.get("/").text


def test_counts_agree_with_their_number(seeded):
    count = lambda page: re.sub(r"\s+", " ", re.search(r'<p role="status" class="count">(.*?)</p>',
                                                       page, re.S).group(1))
    with seeded.server.client() as http:
        assert count(http.get("/?q=smol").text) == "1 model matches"
        assert count(http.get("/?validated=true").text) == "2 models match"
        assert count(http.get("/?q=nothing-like-it").text) == "0 models match"
        assert count(http.get("/").text).endswith(" models")


def test_unknown_paths_answer_a_browser_in_html(seeded):
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    with seeded.server.client() as http:
        r = http.get("/nope", headers={"Accept": browser})
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "<title>Not Found · oscar-zoo</title>" in r.text and "/nope" in r.text
        for path, accept in (("/nope", "*/*"), ("/nope", "application/json"),
                             ("/v1/nope", browser), ("/nope", "application/json, text/html;q=0.5")):
            r = http.get(path, headers={"Accept": accept})
            assert r.status_code == 404, (path, accept)
            assert r.headers["content-type"] == "application/problem+json", (path, accept)
            assert r.json()["status"] == 404


def test_a_lloyd_max_version_says_which_buckets_were_served_and_measured(registry_server, tmp_path):
    from oscar_zoo.zoo.bundle import Bundle, write
    from tests.api.ui.seeding import validation
    from tests.utils.bundles import make_manifest, make_tensors

    m = make_manifest("smollm2-135m")
    report = validation(30, 0).model_copy(update={"quantizer": "lloyd_max"})
    m = m.model_copy(update={"quantization": m.quantization.model_copy(update={"lloyd_max": True}),
                             "validation": report})
    write(Bundle(m, *make_tensors(m)), tmp_path / "b")
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        page = http.get("/models/smollm2-135m/versions/1").text
    assert re.search(r"INT2 group \d+\s+in Lloyd-Max buckets", page)      # the report's
    assert re.search(r"recent \d+, Lloyd-Max</dd>", page)                 # the served cache's


def test_a_version_with_sliding_window_layers_says_what_they_held(registry_server, tmp_path):
    """Its bits per value are above what the BF16 sink and recent explain: the caption says why."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from tests.api.ui.seeding import validation
    from tests.utils.bundles import make_manifest, make_tensors

    m = make_manifest("smollm2-135m")
    report = validation(30, 0).model_copy(update={"window_by_layer": {str(i): 512 for i in range(25)}})
    write(Bundle(m.model_copy(update={"validation": report}), *make_tensors(m)), tmp_path / "b")
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        page = http.get("/models/smollm2-135m/versions/1").text
    assert re.search(r"bits per value at that\s+context, where 25 sliding-window layers hold 512 "
                     r"tokens\)\.</caption>", page)


def test_version_page_links_every_layer_and_downloads_a_range(seeded):
    """version -> layer -> download: each layer's number links its JSON, the range form asks
    layers.safetensors for a rank's share, and the table gives the clip maps' numbers."""
    import struct

    bundle = seeded.bundles[("smollm2-135m", 3)]
    tensors = load_file(str(bundle / "rotations.safetensors"))
    api = "/v1/models/smollm2-135m/versions/3"
    with seeded.server.client() as http:
        page = http.get("/models/smollm2-135m/versions/3").text
        section = page[page.index('<h2 id="layers">'):page.index('<h2 id="files">')]
        rows = re.findall(r'<tr><th scope="row"><a href="([^"]+)">(\d+)</a></th>(.*?)</tr>', section)
        assert [int(r[1]) for r in rows] == list(range(30))
        for href, layer, _ in rows[:2]:
            assert href == f"{api}/layers/{layer}"
            assert http.get(href).json()["layer"] == int(layer)
        form = re.search(r'<form method="get" action="([^"]+)"[^>]*>.*?<input id="layer-spec" '
                         r'name="(\w+)"', section, re.S)
        assert form.group(1) == f"{api}/layers.safetensors" and form.group(2) == "layers"
        r = http.get(form.group(1), params={form.group(2): "2-3"})
        assert r.status_code == 200, r.text
    n = struct.unpack("<Q", r.content[:8])[0]
    header = json.loads(r.content[8:8 + n])
    assert {k.split(".")[1] for k in header if k != "__metadata__"} == {"2", "3"}
    # clip ratios over the KV heads, as the grid colours them: min-max to 3 decimals
    for href, layer, cells in rows:
        shown = re.findall(r"<td>(.*?)</td>", cells)[:2]
        for side, text in zip("kv", shown):
            clip = tensors[f"{side}.{layer}.clip"]
            lo, hi = f"{clip.min():.3f}", f"{clip.max():.3f}"
            assert text == (lo if lo == hi else f"{lo}–{hi}"), (layer, side, text)


def test_alias_history_says_when_older_moves_are_left_out(seeded):
    """The model page shows the latest 10 alias moves; it used to drop the rest silently."""
    with seeded.server.client(seeded.server.token("bundles:publish")) as http:
        for i in range(8):
            r = http.put("/v1/models/smollm2-135m/aliases/recommended",
                         json={"version": 1 + i % 2, "reason": f"move {i}"})
            assert r.status_code == 200, r.text
        page = http.get("/models/smollm2-135m").text
        history = page[page.index('id="hist"'):]
        shown = re.findall(r"<td>(move \d|published version \d|best of the three)</td>", history)
        assert len(shown) == 10 and shown[0] == "move 7"
        link = re.search(r'<a href="([^"]+)" rel="next">the alias history as JSON</a>', history)
        assert link, "no way to the older moves"
        older = [e["reason"] for e in http.get(html.unescape(link.group(1))).json()["history"]]
        every = http.get("/v1/models/smollm2-135m/aliases", params={"limit": 100}).json()["history"]
    assert shown + older == [e["reason"] for e in every] and len(every) == 12   # none lost or twice
    assert '<a href="/models/smollm2-135m/versions/1">v1</a>' in history    # moves link versions


def test_a_page_that_hits_a_bug_answers_a_browser_in_html(seeded, monkeypatch, caplog):
    """A bug in a page (forced here: nothing in the registry's data raises one) answered with
    the API's JSON problem, which a browser shows as raw text; now an HTML 500, and logged."""
    from oscar_zoo.api.ui import figures

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(figures, "spectra", broken)   # the server runs in this process
    with seeded.server.client() as http:
        r = http.get("/models/smollm2-135m/versions/3", headers={"Accept": "text/html"})
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/html")
    assert "<title>Internal error · oscar-zoo</title>" in r.text and "a bug" not in r.text
    assert any(rec.exc_info and rec.exc_info[0] is ZeroDivisionError for rec in caplog.records)


# --- sorting ---------------------------------------------------------------------------------

HOME_SORTS = ("name", "-name", "published", "-published", "versions", "-versions", "loss", "-loss")
VERSION_SORTS = ("version", "-version", "created", "-created", "size", "-size", "loss", "-loss")


def sort_header(page: str, label: str) -> tuple[str, str | None]:
    """A sortable column's header: (its link, unescaped; its aria-sort, None when not sorted)."""
    found = re.search(r'<th scope="col"(?: aria-sort="(\w+)")?><a class="sort" href="([^"]*)">'
                      + re.escape(label) + r"[&<]", page)
    assert found, f"no sortable header {label!r}"
    return html.unescape(found.group(2)), found.group(1)


def version_numbers(page: str) -> list[int]:
    table = page[page.index('<h2 id="versions">'):page.index('<h2 id="jobs">')]
    return [int(n) for n in re.findall(r'<th scope="row"><a href="/models/[^"]+/versions/(\d+)">', table)]


def bundle_loss(validation: dict | None) -> float | None:
    return next((r["delta_nll"] for r in (validation or {}).get("variants", [])
                 if r["name"] == "bundle"), None)


def in_order(keys: dict, sort: str, tie_descending: bool = False) -> list:
    """The rows of `keys` (row -> value) in the order `sort` names, worked out here: rows with
    no value last either way, ties by the row itself (a name; a version number, newest first)."""
    valued = sorted((r for r in keys if keys[r] is not None), reverse=tie_descending)
    valued.sort(key=lambda r: keys[r], reverse=sort.startswith("-"))     # stable: ties stay
    return valued + sorted((r for r in keys if keys[r] is None), reverse=tie_descending)


def home_keys(http) -> dict[str, dict]:
    """Each model's sort values as the JSON API gives them."""
    out = {}
    for m in http.get("/v1/models", params={"limit": 200}).json()["items"]:
        versions = http.get(f"/v1/models/{m['name']}/versions", params={"limit": 200}).json()["items"]
        published = [v["created_at"] for v in versions if v["status"] == "published"]
        head = m["recommended_version"] or m["latest_version"]
        detail = head and http.get(f"/v1/models/{m['name']}/versions/{head}").json()
        out[m["name"]] = {"name": m["name"], "published": max(published, default=None),
                          "versions": len(published),
                          "loss": bundle_loss(detail["validation"]) if detail else None}
    return out


def test_home_sorts_by_each_column(seeded):
    with seeded.server.client() as http:
        keys = home_keys(http)
        for sort in HOME_SORTS:
            want = in_order({name: k[sort.lstrip("-")] for name, k in keys.items()}, sort)
            assert model_names(http.get("/", params={"sort": sort}).text) == want, sort
        first_two = lambda sort: model_names(http.get("/", params={"sort": sort}).text)[:2]
        # the seeded models tell the orders apart (every other model has no version)
        assert first_two("loss") == ["smollm2-135m", "qwen3.5-4b"]     # v2's +0.0044, +0.0052
        assert first_two("-loss") == ["qwen3.5-4b", "smollm2-135m"]
        assert first_two("-published") == ["qwen3.5-4b", "smollm2-135m"]  # published last
        assert first_two("published") == ["smollm2-135m", "qwen3.5-4b"]
        assert first_two("-versions") == ["smollm2-135m", "qwen3.5-4b"]    # 3 and 1
        names = model_names(http.get("/").text)
        assert names == sorted(names) and model_names(http.get("/?sort=-name").text) == names[::-1]
        at = keys["qwen3.5-4b"]["published"]
        assert (f'<td><time datetime="{at}" title="{at[:10]} {at[11:16]} UTC">{at[:10]}</time></td>'
                in http.get("/?q=qwen3.5-4b").text)


def test_model_page_sorts_versions(seeded):
    with seeded.server.client() as http:
        items = http.get("/v1/models/smollm2-135m/versions").json()["items"]
        details = {v["version"]: http.get(f"/v1/models/smollm2-135m/versions/{v['version']}").json()
                   for v in items}
        keys = {"version": {n: n for n in details}, "created": {v["version"]: v["created_at"] for v in items},
                "size": {v["version"]: v["size"] for v in items},
                "loss": {n: bundle_loss(d["validation"]) for n, d in details.items()}}
        for sort in VERSION_SORTS:
            page = http.get("/models/smollm2-135m", params={"sort": sort}).text
            assert version_numbers(page) == in_order(keys[sort.lstrip("-")], sort, True), sort
        assert version_numbers(http.get("/models/smollm2-135m").text) == [3, 2, 1]
        assert version_numbers(http.get("/models/smollm2-135m?sort=version").text) == [1, 2, 3]
        assert version_numbers(http.get("/models/smollm2-135m?sort=-size").text)[0] == 3  # per KV head
        page = http.get("/models/smollm2-135m").text
        row = page[page.index('href="/models/smollm2-135m/versions/1">v1</a></th>'):]
        assert f'<td class="num">{keys["loss"][1]:+.4f}</td>' in row[:row.index("</tr>")]
        # a redirect to the model's own name keeps the order asked for
        r = http.get("/models/HuggingFaceTB/SmolLM2-135M-Instruct?sort=loss", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/models/smollm2-135m?sort=loss"


def test_sort_headers_link_the_other_order_and_mark_the_sorted_one(seeded):
    from oscar_zoo.registry_db.queries import encode_cursor

    with seeded.server.client() as http:
        page = http.get("/").text
        assert sort_header(page, "Model") == ("?sort=-name", "ascending")
        assert sort_header(page, "Published versions") == ("?sort=-versions", None)
        assert sort_header(page, "Last published") == ("?sort=-published", None)
        assert sort_header(page, "Extra loss vs BF16") == ("?sort=loss", None)
        # filters stay, the cursor goes (it belongs to the order it was made in)
        page = http.get("/", params={"q": "s", "sort": "loss", "cursor": encode_cursor(["loss", 0.0, "a"])}).text
        assert sort_header(page, "Extra loss vs BF16") == ("?q=s&sort=-loss", "ascending")
        assert sort_header(page, "Model") == ("?q=s", None)          # the default order
        assert page.count("aria-sort=") == 1 and page.count('<span aria-hidden="true">▲</span>') == 1
        assert "(sort descending)</span>" in page                    # what a click does, said
        page = http.get("/?sort=-published").text
        assert sort_header(page, "Last published") == ("?sort=published", "descending")
        assert '<span aria-hidden="true">▼</span>' in page
        page = http.get("/models/smollm2-135m").text
        assert sort_header(page, "Version") == ("?sort=version#versions", "descending")
        assert sort_header(page, "Created") == ("?sort=-created#versions", None)
        assert sort_header(page, "Size") == ("?sort=size#versions", None)
        assert sort_header(page, "Extra loss vs BF16") == ("?sort=loss#versions", None)
        page = http.get("/models/smollm2-135m?sort=version").text
        assert sort_header(page, "Version") == ("?#versions", "ascending")   # back to the default


def follow(http, path: str, query: str, more: str) -> tuple[list[str], int]:
    """Every page of a list through its rel=next links: (the pages' text, how many)."""
    pages, link = [], query
    while link:
        pages.append(http.get(path + link).text)
        found = re.search(r'<a href="([^"]+)" rel="next">' + more, pages[-1])
        link = html.unescape(found.group(1)) if found else None
    return pages, len(pages)


def test_sorted_lists_page_through_every_row_once(seeded, monkeypatch):
    from oscar_zoo.api.ui import pages

    with seeded.server.client() as http:
        whole = {(q, sort): model_names(http.get(f"/?{q}sort={sort}").text)
                 for q in ("", "validated=true&") for sort in HOME_SORTS}
        versions = {sort: version_numbers(http.get("/models/smollm2-135m", params={"sort": sort}).text)
                    for sort in VERSION_SORTS}
        monkeypatch.setattr(pages, "PAGE_SIZE", 2)        # the server runs in this process
        for (q, sort), want in whole.items():
            texts, n = follow(http, "/", f"?{q}sort={sort}", "More models")
            assert [m for t in texts for m in model_names(t)] == want, (q, sort)
            assert n == max(1, -(-len(want) // 2)), (q, sort)
        assert whole["validated=true&", "-loss"] == ["qwen3.5-4b", "smollm2-135m"]
        for sort, want in versions.items():
            # only newest first are the next page's versions older ones
            label, other = (("Older versions", "More versions") if sort == "-version" else
                            ("More versions", "Older versions"))
            texts, n = follow(http, "/models/smollm2-135m", f"?sort={sort}", label + " →")
            assert [v for t in texts for v in version_numbers(t)] == want and n == 2, sort
            assert other not in texts[0], sort
            # the next page opens at the table, as a re-sorted page does
            assert re.search(r'<a href="\?[^"]*#versions" rel="next">', texts[0]), sort
        # a cursor is refused in an order it was not made in
        second = re.search(r'href="\?sort=loss&amp;cursor=([^"]+)" rel="next"',
                           http.get("/?sort=loss").text).group(1)
        for query in (f"?sort=-loss&cursor={second}", f"?sort=name&cursor={second}"):
            r = http.get("/" + query)
            assert r.status_code == 422 and "cursor" in r.text, query


def test_a_cursor_outside_its_orders_values_is_refused(seeded):
    """json.loads takes NaN and Infinity, which no row compares with as the order needs: a
    page after one would skip rows in silence. Those, and values of the wrong kind or out of
    range, are refused as any bad cursor is (422)."""
    from oscar_zoo.registry_db.queries import encode_cursor

    bad = [("/", ["loss", float("nan"), "smollm2-135m"]), ("/", ["-loss", float("inf"), "a"]),
           ("/", ["loss", float("-inf"), "a"]), ("/", ["loss", 10 ** 30, "a"]),
           ("/", ["-published", "2026-11-27T00:00:00", "a"]),              # no time zone
           ("/", ["published", "0001-01-01T00:00:00+05:00", "a"]),         # before year 1 in UTC
           ("/", ["published", "yesterday", "a"]), ("/", ["-versions", -1, "a"]),
           ("/", ["-versions", None, "a"]), ("/", ["-versions", 2.0, "a"]),
           ("/", ["-name", "a\x00", "a"]), ("/", ["loss", 0.1, 7]), ("/", ["loss", 0.1]),
           ("/models/smollm2-135m", ["loss", float("nan"), 2]),
           ("/models/smollm2-135m", ["-loss", float("inf"), 2]),
           ("/models/smollm2-135m", ["size", None, 2]), ("/models/smollm2-135m", ["size", 1, 2 ** 31]),
           ("/models/smollm2-135m", ["created", "2026-11-27", 2]),
           ("/models/smollm2-135m", ["version", True, 2])]
    good = [("/", ["loss", 0.0044, "smollm2-135m"]), ("/", ["-loss", None, "a"]),
            ("/", ["-published", "2026-11-27T00:00:00+00:00", "a"]), ("/", ["-versions", 1, "a"]),
            ("/", ["loss", 0, "a"]), ("/models/smollm2-135m", ["loss", None, 2]),
            ("/models/smollm2-135m", ["-created", "2026-11-27T01:00:00+01:00", 2])]
    with seeded.server.client() as http:
        for path, value in bad + good:
            r = http.get(path, params={"sort": value[0], "cursor": encode_cursor(value)})
            if (path, value) in good:
                assert r.status_code == 200, (path, value, r.text[:300])
            else:
                assert r.status_code == 422 and "invalid cursor" in r.text, (path, value)
        # past every row: an empty page, not an error
        last = http.get("/", params={"sort": "-loss", "cursor": encode_cursor(["-loss", None, "zzz"])})
        assert last.status_code == 200 and model_names(last.text) == []


def test_the_search_form_keeps_the_order_chosen(seeded):
    """The form sends what its fields hold: a sort left out of them would be lost by a search."""
    form = lambda page: page[page.index('<form role="search"'):page.index("</form>")]
    with seeded.server.client() as http:
        page = http.get("/", params={"sort": "-loss", "q": "s"}).text
        assert '<input type="hidden" name="sort" value="-loss">' in form(page)
        assert 'name="sort"' not in form(http.get("/").text)           # the default stays unsaid
        assert 'name="sort"' not in form(http.get("/?sort=name").text)
        fields = dict(re.findall(r'<input type="(?:hidden|search)"[^>]*name="(\w+)" value="([^"]*)"',
                                 form(page)))
        searched = http.get("/", params={**fields, "q": "qwen"}).text  # as the browser submits it
        assert sort_header(searched, "Extra loss vs BF16") == ("?q=qwen&sort=loss", "descending")


def test_a_sort_outside_the_whitelist_is_refused_with_the_accepted_values(seeded):
    with seeded.server.client() as http:
        for path, accepted in (("/", HOME_SORTS), ("/models/smollm2-135m", VERSION_SORTS),
                               ("/models/qwen3.5-4b", VERSION_SORTS)):
            for bad in ("bogus", "Name", "--loss", "loss ", "name;drop", "x" * 300):
                r = http.get(path, params={"sort": bad})
                assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
                assert "<title>Invalid input · oscar-zoo</title>" in r.text, (path, bad)
                said = html.unescape(re.search(r'<p role="alert">(.*?)</p>', r.text, re.S).group(1))
                assert f"is not one of {', '.join(accepted)}" in said, said
                assert len(said) < 300
            assert http.get(path, params={"sort": ""}).status_code == 200   # empty: the default


# --- jobs and models, both ways --------------------------------------------------------------

def job_rows(section: str) -> dict[str, str]:
    """job id -> its table row (the rows in order)."""
    return dict(re.findall(r'<tr>\s*<th scope="row"><a href="/jobs/([0-9a-f-]{36})">(.*?)</tr>',
                           section, re.S))


def test_model_page_lists_its_latest_jobs_and_links_them(seeded):
    server = seeded.server
    with server.registry.db.read() as session:
        from oscar_zoo.registry_db import queries
        v2 = queries.resolve_version(session, queries.resolve_model(session, "smollm2-135m"), 2).id
    done = add_job(server, status="succeeded", phase="succeeded", result_version_id=v2,
                   created_by="alice", progress={"phase": "succeeded", "done": 1, "total": 1})
    running = add_job(server, phase="pass2", created_by="bob",
                      progress={"phase": "pass2", "done": 7, "total": 30, "layer": 6})
    other = add_job(server, model="qwen3.5-4b")
    section = lambda page: page[page.index('<h2 id="jobs">'):].split("</section>")[0]
    with server.client() as http:
        jobs = section(http.get("/models/smollm2-135m").text)
        rows = job_rows(jobs)
        api = [j["id"] for j in http.get("/v1/jobs", params={"model": "smollm2-135m"}).json()["items"]]
        assert list(rows) == api == [running, done]                  # newest first
        assert other not in jobs
        assert "status-succeeded" in rows[done] and "<td>alice</td>" in rows[done]
        assert '<td><a href="/models/smollm2-135m/versions/2">v2</a></td>' in rows[done]
        assert "status-running" in rows[running] and "<td>bob</td>" in rows[running]
        assert 'value="7"' in rows[running] and "<td>pass2</td>" in rows[running]
        assert "/versions/" not in rows[running]
        submitted = http.get(f"/v1/jobs/{done}").json()["created_at"]
        assert f"<td>{submitted[:10]} {submitted[11:16]} UTC</td>" in rows[done]
        link = re.search(r'<a href="([^"]+)">These jobs on the jobs page</a>', jobs).group(1)
        assert link == "/jobs?model=smollm2-135m"
        listed = http.get(link).text
        assert re.findall(r'href="/jobs/([0-9a-f-]{36})"', listed) == api
        for _ in range(10):
            add_job(server, status="queued", progress={})
        jobs = section(http.get("/models/smollm2-135m").text)
        api = [j["id"] for j in http.get("/v1/jobs", params={"model": "smollm2-135m"}).json()["items"]]
        assert list(job_rows(jobs)) == api[:10] and len(api) == 12
        assert "The 10 latest jobs." in jobs
        assert '<a href="/jobs?model=smollm2-135m">All jobs for smollm2-135m →</a>' in jobs
        quiet = section(http.get("/models/glm-4.7-fp8").text)
        assert "No calibration job for this model here yet" in quiet and "<table" not in quiet
        assert "oscar-zoo jobs submit glm-4.7-fp8" in quiet


def test_jobs_link_their_model_where_it_has_a_page(seeded):
    server = seeded.server
    with server.registry.db.read() as session:
        from oscar_zoo.registry_db import queries
        v2 = queries.resolve_version(session, queries.resolve_model(session, "smollm2-135m"), 2).id
    plain = add_job(server, model="qwen3.5-4b")
    old = add_job(server, model=None, status="succeeded", result_version_id=v2)      # before 0002
    hub = add_job(server, model="tiny-model", spec={"model": "SomeOrg/Tiny-Model"})  # no model row
    # filed under a name that is no model's, its result published under one that is
    made = add_job(server, model="tiny-model", spec={"model": "SomeOrg/Tiny-Model"},
                   status="succeeded", result_version_id=v2)
    with server.client() as http:
        rows = job_rows(http.get("/jobs").text)
        model_cell = lambda job: re.search(r"</th>\s*<td>(.*?)</td>", rows[job], re.S).group(1)
        assert model_cell(plain) == '<a href="/models/qwen3.5-4b">qwen3.5-4b</a>'
        assert model_cell(old) == '<a href="/models/smollm2-135m">smollm2-135m</a>'  # its version's
        assert model_cell(hub) == "tiny-model"                        # its page would be a 404
        assert model_cell(made) == '<a href="/models/smollm2-135m">smollm2-135m</a>'
        made_title = re.search(r"<h1>(.*?)</h1>", http.get(f"/jobs/{made}").text).group(1)
        assert made_title.endswith(' · <a href="/models/smollm2-135m">smollm2-135m</a>')
        assert '<a href="/models/smollm2-135m/versions/2">v2</a>' in rows[old]
        assert http.get("/models/tiny-model").status_code == 404
        title = lambda job: re.search(r"<h1>(.*?)</h1>", http.get(f"/jobs/{job}").text).group(1)
        assert title(plain).endswith(' · <a href="/models/qwen3.5-4b">qwen3.5-4b</a>')
        assert title(old).endswith(' · <a href="/models/smollm2-135m">smollm2-135m</a>')
        assert title(hub).endswith(" · tiny-model") and "<a " not in title(hub)
        page = http.get(f"/jobs/{old}").text
        assert '<a href="/models/smollm2-135m/versions/2">smollm2-135m v2</a>' in page


def test_the_use_it_lines_give_the_public_url_not_the_requests_host(seeded, monkeypatch):
    """The copy-paste OSCAR_ZOO_ENDPOINT came from the request's Host header, which a client (or
    a proxy in front) chooses: the operator's OSCAR_ZOO_PUBLIC_URL, where set, is the address
    users should be given."""
    with seeded.server.client() as http:
        page = http.get("/models/smollm2-135m/versions/3", headers={"Host": "evil.example"}).text
        assert "export OSCAR_ZOO_ENDPOINT=http://evil.example" in html.unescape(page)
        monkeypatch.setenv("OSCAR_ZOO_PUBLIC_URL", "https://zoo.example.org/")
        page = html.unescape(http.get("/models/smollm2-135m/versions/3",
                                      headers={"Host": "evil.example"}).text)
    assert "export OSCAR_ZOO_ENDPOINT=https://zoo.example.org\noscar-zoo pull smollm2-135m@3" in page
    assert "evil.example" not in page
