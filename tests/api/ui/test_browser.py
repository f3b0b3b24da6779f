"""End to end: Debian's chromium (headless, through Playwright) against a real registry server
with seeded data. One server and one browser for the module.

Screenshots of every page go to $OSCAR_ZOO_SCREENSHOTS, else tests-output/screenshots/ at the
repo root (git-ignored), so a person can look at them after a run.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.api.ui.conftest import add_job, seed, update_job

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="chromium is not installed (make venv installs it: "
                                       "apt-get install -y chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory, seed_bundles):
    from tests.utils.registry_server import run_registry

    root = tmp_path_factory.mktemp("ui-e2e")
    with run_registry(f"sqlite:///{root / 'registry.sqlite'}", root / "data") as server:
        yield seed(server, seed_bundles)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    # Playwright gives every launch a fresh temporary --user-data-dir of its own.
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots() -> Path:
    out = Path(os.environ.get("OSCAR_ZOO_SCREENSHOTS") or REPO / "tests-output" / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def page(browser, site):
    context = browser.new_context(base_url=site.server.url, viewport={"width": 1200, "height": 800})
    yield context.new_page()
    context.close()


def test_search_finds_a_model(page, shots):
    from playwright.sync_api import expect

    page.goto("/")
    page.screenshot(path=shots / "home.png", full_page=True)
    page.keyboard.press("/")                          # the search shortcut
    expect(page.locator("#q")).to_be_focused()
    page.keyboard.type("smol")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/\?q=smol"))
    expect(page).to_have_title("Search · oscar-zoo")
    links = page.locator("table.models tbody th a")
    expect(links).to_have_count(1)
    expect(links.first).to_have_text("smollm2-135m")
    page.screenshot(path=shots / "search.png", full_page=True)
    page.locator("#q").fill("")
    page.locator("#validated").check()
    page.locator("form.search button").click()
    expect(page.locator("table.models tbody th a")).to_have_text(["qwen3.5-4b", "smollm2-135m"])


def test_model_page_shows_versions_and_validation(page, shots):
    from playwright.sync_api import expect

    page.goto("/?q=smol")
    page.get_by_role("link", name="smollm2-135m").click()
    expect(page).to_have_title("smollm2-135m · oscar-zoo")
    versions = page.locator("#versions ~ table tbody tr")
    expect(versions).to_have_count(3)
    expect(versions.nth(1)).to_contain_text("recommended")
    table = page.locator("table.numbers")
    for row in ("BF16 KV cache (reference)", "this bundle", "OSCAR as shipped", "Hadamard only",
                "naive INT2"):
        expect(table).to_contain_text(row)
    expect(page.locator("#pull-cmd")).to_contain_text("oscar-zoo pull smollm2-135m@2")
    expect(page.locator("#sglang-cmd")).to_contain_text("--kv-cache-dtype int2")
    expect(page.locator("button[data-copy]").first).to_be_visible()   # JS enhanced the page


def test_a_job_links_its_model_and_the_model_its_jobs(page, site, shots):
    from oscar_zoo.registry_db import queries
    from playwright.sync_api import expect

    server = site.server
    with server.registry.db.read() as session:
        v2 = queries.resolve_version(session, queries.resolve_model(session, "smollm2-135m"), 2).id
    done = add_job(server, status="succeeded", phase="succeeded", result_version_id=v2,
                   created_by="alice", lease_holder=None, finished_at=datetime.now(timezone.utc),
                   progress={"phase": "succeeded", "done": 1, "total": 1})
    running = add_job(server, phase="pass2", created_by="bob",
                      progress={"phase": "pass2", "done": 12, "total": 30, "layer": 11})
    page.goto("/jobs")
    row = page.locator("tbody tr").filter(has=page.locator(f'a[href="/jobs/{done}"]'))
    row.get_by_role("link", name="smollm2-135m", exact=True).click()
    expect(page).to_have_title("smollm2-135m · oscar-zoo")
    jobs = page.locator('section[aria-labelledby="jobs"] tbody tr')
    expect(jobs.nth(0)).to_contain_text(running[:8])          # newest first
    expect(jobs.nth(0)).to_contain_text("bob")
    expect(jobs.nth(1)).to_contain_text(done[:8])
    expect(jobs.nth(1)).to_contain_text("alice")
    expect(page.locator("button[data-copy]").first).to_be_visible()   # JS enhanced the page
    page.screenshot(path=shots / "model.png", full_page=True)
    jobs.nth(1).get_by_role("link", name="v2", exact=True).click()     # the version it published
    expect(page).to_have_title("smollm2-135m v2 · oscar-zoo")
    page.go_back()
    page.get_by_role("link", name="These jobs on the jobs page").click()
    expect(page).to_have_url(re.compile(r"/jobs\?model=smollm2-135m$"))
    expect(page.locator("tbody tr").first).to_contain_text(running[:8])
    page.get_by_role("link", name=running[:8]).click()
    expect(page).to_have_title(f"Job {running[:8]} · oscar-zoo")
    page.get_by_role("heading", level=1).get_by_role("link", name="smollm2-135m").click()
    expect(page).to_have_title("smollm2-135m · oscar-zoo")


def test_sorting_a_table_by_its_header(page):
    """Headers are links (no JavaScript): a click sorts, the next one reverses the order, and
    the sorted column says so to assistive technology (aria-sort)."""
    from playwright.sync_api import expect

    page.goto("/")
    names = page.locator("table.models tbody th a")
    loss = page.get_by_role("columnheader", name="Extra loss vs BF16")
    expect(page.get_by_role("columnheader", name="Model")).to_have_attribute("aria-sort", "ascending")
    expect(loss).not_to_have_attribute("aria-sort", re.compile("."))
    page.get_by_role("link", name="Extra loss vs BF16").click()
    expect(page).to_have_url(re.compile(r"/\?sort=loss$"))
    expect(loss).to_have_attribute("aria-sort", "ascending")
    assert names.all_text_contents()[:2] == ["smollm2-135m", "qwen3.5-4b"]   # +0.0044, +0.0052
    page.get_by_role("link", name="Extra loss vs BF16").click()
    expect(page).to_have_url(re.compile(r"/\?sort=-loss$"))
    expect(loss).to_have_attribute("aria-sort", "descending")
    assert names.all_text_contents()[:2] == ["qwen3.5-4b", "smollm2-135m"]
    # models with no version have no loss: last, by name, whichever the direction
    rest = names.all_text_contents()[2:]
    assert rest == sorted(rest) and len(rest) > 2
    page.locator("#validated").check()                  # a search keeps the order chosen
    page.locator("form.search button").click()
    expect(page).to_have_url(re.compile(r"[?&]validated=true&sort=-loss$"))
    expect(loss).to_have_attribute("aria-sort", "descending")
    expect(names).to_have_text(["qwen3.5-4b", "smollm2-135m"])

    page.goto("/models/smollm2-135m")
    versions = page.locator("#versions ~ table tbody th a")
    expect(versions).to_have_text(["v3", "v2", "v1"])
    page.locator("#versions ~ table").get_by_role("link", name="Version").click()
    expect(page).to_have_url(re.compile(r"/models/smollm2-135m\?sort=version#versions$"))
    expect(versions).to_have_text(["v1", "v2", "v3"])
    expect(page.locator("#versions")).to_be_in_viewport()     # the page opens at its table
    page.locator("#versions ~ table").get_by_role("link", name="Size").click()
    expect(page).to_have_url(re.compile(r"\?sort=size#versions$"))
    expect(versions.first).not_to_have_text("v3")             # the per-KV-head bundle is biggest
    expect(versions.last).to_have_text("v3")


def test_version_page_renders_its_charts(page, shots):
    from playwright.sync_api import expect

    page.goto("/models/smollm2-135m")
    page.locator("#versions ~ table").get_by_role("link", name="v3", exact=True).click()
    expect(page).to_have_title("smollm2-135m v3 · oscar-zoo")
    charts = page.locator("svg.chart")
    expect(charts).to_have_count(5)           # attention error, K/V spectra, K/V clip grids
    for i in range(5):
        box = charts.nth(i).bounding_box()
        assert box["width"] > 150 and box["height"] > 100, box
    drawn = page.evaluate("""() => [...document.querySelectorAll('svg.chart path')]
        .filter(p => { const b = p.getBBox(); return b.width > 0 && b.height > 0; }).length""")
    assert drawn >= 5 * 4
    expect(page.get_by_role("img", name="K (keys): eigenvalue spectrum per layer")).to_be_visible()
    page.screenshot(path=shots / "version.png", full_page=True)


def test_version_page_downloads_a_layer_range(page):
    """The range form: chromium accepts its pattern (an invalid one would accept anything),
    refuses a malformed spec before asking the server, and downloads the layers asked."""
    from playwright.sync_api import expect

    page.goto("/models/smollm2-135m/versions/3")
    spec = page.get_by_role("textbox", name="Layers")
    expect(spec).to_have_value("0-29")
    spec.fill("2-")
    assert not spec.evaluate("el => el.checkValidity()")
    spec.fill("2-3, 7")
    assert spec.evaluate("el => el.checkValidity()")
    with page.expect_download() as got:
        page.get_by_role("button", name="Download").click()
    assert got.value.suggested_filename == "smollm2-135m-v3-layers-2-7.safetensors"


def test_job_page_updates_while_the_job_runs(page, site, shots):
    from oscar_zoo.registry_db import queries
    from playwright.sync_api import expect

    server = site.server
    job = add_job(server, progress={"phase": "pass1", "done": 0, "total": 30, "layer": 0})
    page.goto(f"/jobs/{job}")
    expect(page.locator('[data-field="status"]')).to_have_text("running")
    expect(page.locator('[data-field="refresh"]')).to_contain_text("Live")
    expect(page.locator('[data-field="cancel"]')).to_be_hidden()     # no cancel was asked
    update_job(server, job, progress={"phase": "pass1", "done": 12, "total": 30, "layer": 11})
    expect(page.locator('[data-field="count"]')).to_have_text("12 / 30")
    expect(page.locator('[data-field="layer"]')).to_have_text("layer 11")
    page.screenshot(path=shots / "job-running.png", full_page=True)
    update_job(server, job, phase="fitting",
               progress={"phase": "fitting", "done": 30, "total": 30, "layer": 29})
    expect(page.locator('[data-field="phase"]')).to_have_text("fitting")
    with server.registry.db.read() as session:
        v2 = queries.resolve_version(session, queries.resolve_model(session, "smollm2-135m"), 2)
    worker = {"id": "worker:gpu-box:7:abc", "host": "gpu-box", "pid": 7}
    update_job(server, job, status="succeeded", phase="done", result_version_id=v2.id,
               finished_at=datetime.now(timezone.utc), lease_holder=None,
               progress={"phase": "done", "done": 1, "total": 1, "worker": worker})
    expect(page.locator('[data-field="status"]')).to_have_text("succeeded")
    expect(page.locator('[data-field="result"] a')).to_have_text("smollm2-135m v2")
    # the lease is gone once the job ends: the worker its progress named stays shown
    expect(page.locator('[data-field="worker"]')).to_have_text("worker:gpu-box:7:abc")
    page.screenshot(path=shots / "job-done.png", full_page=True)
    page.goto("/jobs")
    expect(page.locator("tbody tr").first).to_contain_text("succeeded")
    page.screenshot(path=shots / "jobs.png", full_page=True)


def test_job_page_says_why_a_queued_job_waits_and_drops_it_live(page, site):
    from oscar_zoo.registry_db import workers as workers_db
    from playwright.sync_api import expect

    job = add_job(site.server, status="queued", progress={})
    page.goto(f"/jobs/{job}")
    expect(page.locator('[data-field="waiting"]')).to_contain_text("no worker has asked for work")
    with site.server.registry.db.write() as session:
        workers_db.seen(session, "gpu-box:1:a", 1, False)            # a worker asks for work
    expect(page.locator('[data-field="waiting"]')).to_be_hidden()


WATCH_LIVE = """() => {
  window.__announced = [];
  const watch = new MutationObserver((records) => window.__announced.push(...records.map(
    (r) => r.target.closest("[aria-live], [role=status]").dataset.field || "live")));
  for (const el of document.querySelectorAll("[aria-live], [role=status]"))
    watch.observe(el, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def test_job_events_rewrite_live_regions_only_when_they_change(page, site):
    """A screen reader announces a live region on every change to its DOM: progress events
    that leave the status, phase and waiting message as they were must not touch them."""
    from oscar_zoo.registry_db import workers as workers_db
    from playwright.sync_api import expect

    running = add_job(site.server)
    page.goto(f"/jobs/{running}")
    expect(page.locator('[data-field="refresh"]')).to_contain_text("Live")
    page.evaluate(WATCH_LIVE)
    for done in (5, 6):
        update_job(site.server, running, progress={"phase": "pass1", "done": done, "total": 30, "layer": done})
        expect(page.locator('[data-field="count"]')).to_have_text(f"{done} / 30")
    assert page.evaluate("window.__announced") == []
    update_job(site.server, running, phase="fitting")
    expect(page.locator('[data-field="phase"]')).to_have_text("fitting")
    assert "live" in page.evaluate("window.__announced")

    with site.server.registry.db.write() as session:
        workers_db.seen(session, "gpu-box:2:b", 1, False)            # not a Ray dispatcher
    queued = add_job(site.server, status="queued", progress={},
                     spec={"model": "smollm2-135m", "ray_resources": {"tpu": 1.0}})
    page.goto(f"/jobs/{queued}")
    expect(page.locator('[data-field="refresh"]')).to_contain_text("Live")
    page.evaluate(WATCH_LIVE)
    update_job(site.server, queued, attempts=2)
    expect(page.locator('[data-field="attempts"]')).to_contain_text("2")
    expect(page.locator('[data-field="waiting"]')).to_contain_text("no Ray dispatcher")
    assert page.evaluate("window.__announced") == []
    with site.server.registry.db.write() as session:
        workers_db.seen(session, "ray-dispatch:1:c", None, True)
    expect(page.locator('[data-field="waiting"]')).to_be_hidden()
    assert "waiting" in page.evaluate("window.__announced")


def test_job_page_shows_timings_and_a_cancel_live_and_says_when_the_stream_is_refused(page, site):
    from playwright.sync_api import expect

    job = add_job(site.server)
    page.goto(f"/jobs/{job}")
    expect(page.locator('[data-field="refresh"]')).to_contain_text("Live")
    expect(page.locator('[data-field="timings"]')).to_be_hidden()
    update_job(site.server, job, timings={"loading": 2.04, "pass1": 12.345}, cancel_requested=True)
    expect(page.locator('[data-field="timings"] td').nth(1)).to_have_text("12.3 s")
    expect(page.locator('[data-field="cancel"]')).to_be_visible()
    # a proxy answering the stream with an error: the browser never retries it
    page.route("**/events", lambda route: route.fulfill(status=502, body="bad gateway"))
    page.reload()
    expect(page.locator('[data-field="refresh"]')).to_contain_text("Live updates stopped")
    expect(page.locator('[data-field="refresh"] a')).to_have_text("Refresh")


def test_pages_work_without_javascript(browser, site):
    from playwright.sync_api import expect

    context = browser.new_context(base_url=site.server.url, java_script_enabled=False)
    page = context.new_page()
    page.goto("/")
    page.locator("#q").fill("qwen3.5")
    page.locator("#q").press("Enter")                 # a plain GET form
    expect(page.locator("table.models tbody th a")).to_have_text(["qwen3.5-35b-a3b", "qwen3.5-4b"])
    page.goto("/models/qwen3.5-4b")
    expect(page.locator("button[data-copy]").first).to_be_hidden()
    job = add_job(site.server, status="queued", progress={})
    page.goto(f"/jobs/{job}")
    expect(page.get_by_role("link", name="Refresh")).to_be_visible()
    expect(page.locator('[data-field="status"]')).to_have_text("queued")
    context.close()


def offline(context, origin: str) -> list[str]:
    """Abort every request of `context` that is not for `origin` (the loopback server), as on
    an air-gapped host; returns the list of those aborted, filled in as they happen."""
    refused = []

    def route(r):
        if r.request.url.startswith(origin + "/"):
            return r.continue_()
        refused.append(r.request.url)
        return r.abort("internetdisconnected")

    context.route("**/*", route)
    return refused


def test_api_docs_render_and_run_offline(browser, site, shots):
    """/docs (Swagger UI) with nothing reachable but this server: it draws the operations from
    our OpenAPI schema, and one runs from the page."""
    from playwright.sync_api import expect

    context = browser.new_context(base_url=site.server.url, viewport={"width": 1200, "height": 800})
    refused = offline(context, site.server.url)
    page = context.new_page()
    page.goto("/docs")
    expect(page.locator(".info .title")).to_contain_text("oscar-zoo registry")
    health = page.locator("#operations-service-health_v1_health_get")
    expect(health.locator(".opblock-summary-path")).to_have_text("/v1/health")
    versions = page.locator('.opblock-summary-path[data-path="/v1/models/{name}/versions"]')
    expect(versions).to_have_count(2)                 # GET lists the versions, POST publishes
    page.screenshot(path=shots / "api-docs.png")
    health.locator(".opblock-summary").click()
    health.get_by_role("button", name="Try it out").click()
    health.get_by_role("button", name="Execute").click()
    expect(health.locator(".live-responses-table tbody .response-col_status")).to_have_text("200")
    expect(health.locator(".live-responses-table .microlight").first).to_contain_text('"ok"')
    assert refused == []
    context.close()
