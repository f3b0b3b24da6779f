"""The pages tell the truth about unusual but valid data: a model whose newest version failed
validation, a free-text source_job, a model with no published version, a bundle missing one
eigenvalue tensor, and layers whose head dim or KV heads differ from the model's."""

from __future__ import annotations

import re
import uuid

import numpy as np
import pytest
from oscar_zoo.api.ui import pages
from oscar_zoo.zoo.bundle import Bundle, write

from tests.api.ui.conftest import add_job
from tests.api.ui.seeding import add_bulk_models, make_validated_bundle
from tests.api.ui.test_pages import (HOME_SORTS, VERSION_SORTS, bundle_loss, charts, decode_grid,
                                     follow, model_names, sort_header, version_numbers)
from tests.utils.bundles import make_bundle, make_manifest, make_tensors
from tests.utils.registry_server import upload_bundle


def row_of(page: str, model: str) -> str:
    row = page[page.index(f'href="/models/{model}"'):]
    return row[:row.index("</tr>")]


def test_validated_only_judges_the_version_the_row_shows(registry_server, tmp_path):
    for seed, passed in ((1, True), (2, False)):       # v1 passed, v2 (latest) failed
        make_validated_bundle(tmp_path / f"b{seed}", seed=seed, passed=passed)
        registry_server.publish_dir(tmp_path / f"b{seed}", status="published")
    with registry_server.client(registry_server.token("bundles:publish")) as http:
        assert "smollm2-135m" not in model_names(http.get("/?validated=true").text)
        assert "failed" in row_of(http.get("/").text, "smollm2-135m")
        r = http.put("/v1/models/smollm2-135m/aliases/recommended", json={"version": 1})
        assert r.status_code == 200, r.text
        page = http.get("/?validated=true").text
    assert model_names(page) == ["smollm2-135m"]
    row = row_of(page, "smollm2-135m")
    assert 'versions/1">v1</a>' in row and "passed" in row and "failed" not in row


def test_source_job_links_only_to_a_job_that_exists(registry_server, tmp_path):
    job_id = str(uuid.uuid4())
    make_bundle(tmp_path / "b1", seed=1)
    make_bundle(tmp_path / "b2", seed=2)
    with registry_server.client(registry_server.token("bundles:publish")) as http:
        r = upload_bundle(http, tmp_path / "b1", source_job="my-ci-run-42")
        assert r.status_code == 201, r.text
        registry_server.publish_dir(tmp_path / "b2", source_job=job_id)
        add_job(registry_server, id=job_id, status="succeeded")
        free_text = http.get("/models/smollm2-135m/versions/1").text
        real = http.get("/models/smollm2-135m/versions/2").text
    assert "from job my-ci-run-42" in free_text and 'href="/jobs/my-ci-run-42"' not in free_text
    assert f'from job <a href="/jobs/{job_id}">{job_id[:8]}</a>' in real


def test_a_model_with_only_yanked_versions_says_so(registry_server, tmp_path):
    with registry_server.client(registry_server.token("bundles:publish")) as http:
        for n in (1, 2):
            make_bundle(tmp_path / f"b{n}", seed=n)
            registry_server.publish_dir(tmp_path / f"b{n}")
            r = http.post(f"/v1/models/smollm2-135m/versions/{n}/yank", json={"reason": "bad"})
            assert r.status_code == 200, r.text
        page = http.get("/models/smollm2-135m").text
    assert "has been published yet" not in page
    assert "Every version of this model is yanked or a draft" in page
    assert page.count("status-yanked") == 2


def test_a_missing_eigenvalue_tensor_leaves_a_gap_not_a_hole(registry_server, tmp_path):
    manifest = make_manifest(seed=1)
    k, v = make_tensors(manifest, 1)
    v[0].eigenvalues = None                           # only v.0.eigenvalues is absent
    write(Bundle(manifest, k, v), tmp_path / "b")
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        found = charts(http.get("/models/smollm2-135m/versions/1").text)
    grid = decode_grid(found["V (values): eigenvalue spectrum per layer"], (30, 64))
    assert (grid[0] == -1).all()                      # layer 0: a gap
    assert (grid[1:] >= 0).all()                      # every other layer drawn
    assert (decode_grid(found["K (keys): eigenvalue spectrum per layer"], (30, 64)) >= 0).all()


def test_per_layer_geometry_is_shown(registry_server):
    # gemma-4-12b (from the catalog): head dim 256, but 512 on its full-attention layers
    with registry_server.client() as http:
        page = http.get("/models/gemma-4-12b").text
        home = http.get("/?q=gemma-4-12b").text
    facts = re.sub(r"\s+", " ", re.search(r'<dl class="facts">(.*?)</dl>', page, re.S).group(1))
    assert "<dt>head dim</dt><dd>256 (512 on 8 layers: 5, 11, 17, 23, 29, 35, 41, 47)</dd>" in facts
    assert "<dt>KV heads</dt><dd>8</dd>" in facts
    assert "d 256 (512 on 8 layers: 5, 11, 17, ...)" in row_of(home, "gemma-4-12b")


def test_padded_treats_a_missing_row_as_a_gap():
    from oscar_zoo.api.ui.figures import padded

    grid = padded([np.array([1.0, 2.0]), None, np.array([3.0])])
    assert grid.shape == (3, 2) and np.isnan(grid[1]).all() and np.isnan(grid[2, 1])


def test_a_draft_version_says_it_is_not_published(registry_server, tmp_path):
    make_bundle(tmp_path / "b1", seed=1)
    registry_server.publish_dir(tmp_path / "b1", status="draft")
    with registry_server.client() as http:
        page = http.get("/models/smollm2-135m/versions/1").text
    banner = re.search(r'<p class="warn" role="note">(.*?)</p>', page, re.S)
    assert banner, "no banner on a draft's page"
    text = re.sub(r"\s+", " ", banner.group(1))
    assert "draft" in text and "not published" in text
    assert "<code>oscar-zoo pull smollm2-135m</code> does not get it" in text
    assert "<code>oscar-zoo promote smollm2-135m@1</code>" in text


def test_home_counts_published_versions_and_does_not_call_every_model_calibrated(
        registry_server, tmp_path):
    with registry_server.client(registry_server.token("bundles:publish")) as http:
        for n, status in ((1, "published"), (2, "published"), (3, "draft")):
            make_bundle(tmp_path / f"b{n}", seed=n)
            registry_server.publish_dir(tmp_path / f"b{n}", status=status)
        r = http.post("/v1/models/smollm2-135m/versions/1/yank", json={"reason": "bad"})
        assert r.status_code == 200, r.text
        home = http.get("/").text
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row_of(home, "smollm2-135m"), re.S)
    assert re.sub(r"\s+", " ", cells[2]).strip() == "1 <small>(also 1 draft, 1 yanked)</small>"
    assert sort_header(home, "Published versions")[0] == "?sort=-versions"
    # catalog entries with no version are listed, and say so, under a heading that allows them
    assert "qwen3-8b" in model_names(home)
    assert "not calibrated yet" in row_of(home, "qwen3-8b")
    assert "Models with calibrated rotations" not in home


def test_a_finished_job_names_its_worker_and_does_not_claim_a_gpu(registry_server, tmp_path):
    manifest = make_manifest(seed=1)
    manifest = manifest.model_copy(update={"calibration": manifest.calibration.model_copy(
        update={"hardware": "cpu (x86_64, 2 cores)"})})
    k, v = make_tensors(manifest, 1)
    write(Bundle(manifest, k, v), tmp_path / "b")
    version_id = registry_server.publish_dir(tmp_path / "b").version.id
    worker = {"id": "worker:cpu-box:4242:a1b2c3", "host": "cpu-box", "pid": 4242}
    job = add_job(registry_server, status="succeeded", phase="succeeded", gpus=1,
                  result_version_id=version_id,
                  progress={"phase": "succeeded", "done": 1, "total": 1, "worker": worker})
    failed = add_job(registry_server, status="failed", phase="failed", gpus=1,
                     progress={"phase": "failed", "worker": {"id": "w2", "host": "gpu-box"}})
    with registry_server.client() as http:
        page = http.get(f"/jobs/{job}").text
        other = http.get(f"/jobs/{failed}").text
    facts = re.sub(r"\s+", " ", re.search(r'<dl class="facts">(.*?)</dl>', page, re.S).group(1))
    assert '<dt>worker</dt><dd data-field="worker">worker:cpu-box:4242:a1b2c3</dd>' in facts
    assert "<dt>GPUs asked</dt><dd>1</dd>" in facts and "<dt>GPUs</dt>" not in facts
    assert "<dt>calibrated on</dt><dd>cpu (x86_64, 2 cores)</dd>" in facts
    assert '<dd data-field="worker">w2 on gpu-box</dd>' in other      # host not in its id
    assert "calibrated on" not in other                               # no bundle: not known


ERROR_CHART = "Attention output error per layer, relative to BF16 (lower is better)"
PAGE_WIDTH = 1180 - 2 * 24                   # main's max-width less its padding (style.css)
NS = "{http://www.w3.org/2000/svg}"


def axis_labels(svg) -> list[str]:
    return [t.text for t in svg.iter(f"{NS}text") if t.get("class") == "axis"]


def test_a_deep_models_per_layer_errors_fit_the_page(registry_server, tmp_path):
    """600 layers: grouped bars were 5400 px wide, which the page shrank to a 45 px strip with
    unreadable ticks. Now lines, as wide as the page allows, each point the report's number."""
    bundle = make_validated_bundle(tmp_path / "b", name="deep", seed=4, layers=600)
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        page = http.get("/models/deep/versions/1").text
    chart = charts(page)[ERROR_CHART]
    assert float(chart.get("width")) <= PAGE_WIDTH
    assert axis_labels(chart) == ["||o - o_bf16|| / ||o_bf16||", "layer"]
    report = {v.name: v.per_layer_attn_rel_error for v in bundle.manifest.validation.variants}
    lines = [p for p in chart.iter(f"{NS}path") if p.get("fill") == "none"]
    assert len(lines) == len(report)
    for path, name in zip(lines, ("bundle", "bundle-served", "oscar-shipped", "hadamard", "naive")):
        heights = np.array([220 - float(y) for y in re.findall(r"[ML][\d.]+ ([\d.]+)", path.get("d"))])
        want = np.array(report[name])
        assert len(heights) == 600
        scale = (heights * want).sum() / (want * want).sum()          # px per unit error
        np.testing.assert_allclose(heights, want * scale, atol=0.06)  # drawn to 0.1 px


def test_a_report_that_does_not_match_the_layers_is_not_drawn_as_layer_ids(registry_server, tmp_path):
    """qwen3.5-4b keeps a KV cache on 8 layers (3, 7, ... 31); an uploaded report with 30
    entries per variant cannot be placed on them: the axis says what its ticks are instead of
    calling them layers, and the per-layer table leaves those numbers out."""
    from tests.api.ui.seeding import validation

    m = make_manifest("qwen3.5-4b", seed=2)
    m = m.model_copy(update={"validation": validation(30, 2)})
    write(Bundle(m, *make_tensors(m, 2)), tmp_path / "b")
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        page = http.get("/models/qwen3.5-4b/versions/1").text
    chart = charts(page)[ERROR_CHART]
    x_label = axis_labels(chart)[1]
    assert x_label != "layer" and "8 layers" in x_label
    table = page[page.index('id="layers"'):]
    assert "attention error:" not in table                           # not joined to layer ids
    assert re.findall(r'<th scope="row"><a href="[^"]+/layers/(\d+)">', table) == \
        [str(i) for i in range(3, 32, 4)]


def test_one_clip_pair_is_not_called_per_global(registry_server, tmp_path):
    make_bundle(tmp_path / "b", seed=1, k_clip=0.96, v_clip=0.92)    # clip granularity global
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        page = http.get("/models/smollm2-135m/versions/1").text
    fact = re.search(r"<dt>clip ratios</dt><dd>(.*?)</dd>", page).group(1)
    assert fact == "K 0.96 / V 0.92 (one pair for every layer)"


def test_orders_count_what_a_pull_gets_and_put_missing_values_last(registry_server, tmp_path,
                                                                   monkeypatch):
    """The sorted columns' edge cases: versions of equal loss (newest first either way), versions
    and models with no validation report (last either way), and drafts and yanked versions,
    which are neither counted as published nor date a model's last publish."""
    def publish(name: str, model: str = "smollm2-135m", seed: int = 0, validated: bool = True,
                **kw) -> None:
        make = make_validated_bundle if validated else make_bundle
        make(tmp_path / name, model=model, seed=seed)
        registry_server.publish_dir(tmp_path / name, **kw)

    for n, seed in enumerate((3, 5, 4, 0), 1):         # extra loss +0.0052, +0.0040, +0.0056, +0.0040
        publish(f"s{n}", seed=seed)
    publish("s5", seed=5, validated=False)             # smollm2-135m v5: no report
    publish("q1", "qwen3.5-4b", seed=1)
    publish("q2", "qwen3.5-4b", seed=2)
    publish("s6", seed=6, validated=False, status="draft")   # the newest upload, a draft
    with registry_server.client(registry_server.token("bundles:publish")) as http:
        for n in (1, 2, 3, 4):
            r = http.post(f"/v1/models/smollm2-135m/versions/{n}/yank", json={"reason": "bad"})
            assert r.status_code == 200, r.text
        names = lambda sort: model_names(http.get("/", params={"sort": sort}).text)
        numbers = lambda sort: version_numbers(http.get("/models/smollm2-135m", params={"sort": sort}).text)
        assert numbers("loss") == [4, 2, 1, 3, 6, 5]
        assert numbers("-loss") == [3, 1, 4, 2, 6, 5]
        # smollm2-135m: 1 version published (v5) and the newest upload (a draft); qwen3.5-4b: 2
        assert names("-versions")[:2] == ["qwen3.5-4b", "smollm2-135m"]
        assert names("-published")[:2] == ["qwen3.5-4b", "smollm2-135m"]
        assert names("published")[:2] == ["smollm2-135m", "qwen3.5-4b"]
        v5 = http.get("/v1/models/smollm2-135m/versions/5").json()["created_at"]
        assert f'<time datetime="{v5}"' in row_of(http.get("/").text, "smollm2-135m")
        for sort in ("loss", "-loss"):      # smollm2-135m's row shows v5, which has no report
            shown = names(sort)
            assert shown[0] == "qwen3.5-4b" and shown[1:] == sorted(shown[1:]), sort
            assert "smollm2-135m" in shown[1:]
        # a page ending inside a run of equal values, or among the rows with none, is followed
        # by the rest of that run: the cursor holds the value and the tie
        whole = {sort: numbers(sort) for sort in VERSION_SORTS}
        monkeypatch.setattr(pages, "PAGE_SIZE", 2)         # the server runs in this process
        for sort, want in whole.items():
            texts, _ = follow(http, "/models/smollm2-135m", f"?sort={sort}", "(?:Older|More) versions")
            assert [v for t in texts for v in version_numbers(t)] == want, sort
        assert whole["loss"] == [4, 2, 1, 3, 6, 5] and whole["-loss"] == [3, 1, 4, 2, 6, 5]


def sort_keys(db) -> tuple[dict, dict, set]:
    """Worked out here, in Python, from the rows: each model's values for every column the home
    page sorts by, its place in the database's own order of names (its collation decides ties),
    and which models are validated (the headline version passed)."""
    from oscar_zoo.registry_db.models import Alias, BundleVersion, Model
    from sqlalchemy import select

    with db.read() as s:
        names = list(s.scalars(select(Model.name).order_by(Model.name)))
        ids = dict(s.execute(select(Model.id, Model.name)).all())
        versions = {v.id: v for v in s.scalars(select(BundleVersion))}
        aliases = {(a.model_id, a.name): a.version_id for a in s.scalars(select(Alias))}
    keys = {n: {"name": n, "published": None, "versions": 0, "loss": None} for n in names}
    heads = {}
    for v in versions.values():
        k = keys[ids[v.model_id]]
        if v.status == "published":
            k["versions"] += 1
            k["published"] = max(filter(None, (k["published"], v.created_at)))
    for model_id, name in ids.items():
        head = aliases.get((model_id, "recommended"), aliases.get((model_id, "latest")))
        if head is not None:
            heads[name] = versions[head]
            keys[name]["loss"] = bundle_loss(versions[head].validation)
    validated = {n for n, v in heads.items() if v.validation_passed is True and keys[n]["versions"]}
    return keys, {n: i for i, n in enumerate(names)}, validated


def test_more_models_than_a_page_page_through_every_order(registry_server):
    """Some 130 models, most of them written straight into the database, with many equal values
    (7 losses, 7 upload times, 0-3 published versions) and models with none: each order, with
    and without filters, pages through them all once, in the order worked out here; and each
    page asks the database for one page, not for every model (no list of every model id, which
    PostgreSQL refuses past 65,535)."""
    from sqlalchemy import event

    add_bulk_models(registry_server.registry.db, 120, spread=7)
    keys, rank, validated = sort_keys(registry_server.registry.db)
    assert len(keys) > 2 * pages.PAGE_SIZE
    params: list[int] = []
    engine = registry_server.registry.db.engine
    listen = lambda conn, cursor, statement, parameters, context, many: params.append(
        len(parameters or ()))
    event.listen(engine, "before_cursor_execute", listen)
    try:
        with registry_server.client() as http:
            for query, keep in (("", lambda n: True), ("q=bulk&", lambda n: n.startswith("bulk-")),
                                ("validated=true&", validated.__contains__),
                                ("q=bulk-0000*&architecture=BulkArch2&validated=true&",
                                 lambda n: n in validated and n.startswith("bulk-0000")
                                 and int(n[5:]) % 5 == 2)):
                for sort in HOME_SORTS:
                    column = sort.lstrip("-")
                    want = in_order({n: rank[n] if column == "name" else k[column]
                                     for n, k in keys.items() if keep(n)}, sort, rank)
                    texts, count = follow(http, "/", f"?{query}sort={sort}", "More models")
                    assert [m for t in texts for m in model_names(t)] == want, (query, sort)
                    assert count == max(1, -(-len(want) // pages.PAGE_SIZE)), (query, sort)
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert max(params) < 2 * pages.PAGE_SIZE, max(params)


def in_order(keys: dict, sort: str, rank: dict) -> list:
    """test_pages.in_order with ties by the database's order of names."""
    valued = sorted((r for r in keys if keys[r] is not None), key=rank.__getitem__)
    valued.sort(key=lambda r: keys[r], reverse=sort.startswith("-"))     # stable: ties stay
    return valued + sorted((r for r in keys if keys[r] is None), key=rank.__getitem__)


def test_names_sort_by_the_databases_collation_either_way(registry_server, registry_backend,
                                                          monkeypatch):
    """Under a collation that is not C (ICU puts `_` before `-`, C after), the database decides
    where a name goes in every order and where the next page starts: `-name` is `name`
    reversed, and a page ending inside a run of ties is followed by the rest of it."""
    from sqlalchemy import text

    if registry_backend != "postgresql":
        pytest.skip("SQLite has no collation other than the bytes'")
    engine = registry_server.registry.db.engine
    with engine.begin() as conn:
        if not conn.scalar(text("select count(*) from pg_collation where collname = 'en-x-icu'")):
            pytest.skip("PostgreSQL was built without ICU")
        conn.execute(text('alter table models alter column name type varchar(200) collate "en-x-icu"'))
    db = registry_server.registry.db
    for prefix in ("m-a", "m_a", "m.a", "m0a"):
        add_bulk_models(db, 3, prefix=prefix, spread=2)
    keys, rank, _ = sort_keys(db)
    names = sorted(keys, key=rank.__getitem__)
    assert names.index("m_a-000000") < names.index("m-a-000000")      # not the bytes' order
    with registry_server.client() as http:
        shown = model_names(http.get("/", params={"q": "m*"}).text)
        assert shown == [n for n in names if n.startswith("m")]
        whole = {sort: model_names(http.get("/", params={"q": "m*", "sort": sort}).text)
                 for sort in HOME_SORTS}
        assert whole["-name"] == whole["name"][::-1] == shown[::-1]
        monkeypatch.setattr(pages, "PAGE_SIZE", 2)
        for sort, want in whole.items():
            column = sort.lstrip("-")
            assert want == in_order({n: rank[n] if column == "name" else keys[n][column]
                                     for n in shown}, sort, rank), sort
            texts, _ = follow(http, "/", f"?q=m*&sort={sort}", "More models")
            assert [m for t in texts for m in model_names(t)] == want, sort
