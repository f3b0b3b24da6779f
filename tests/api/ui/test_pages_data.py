"""The pages tell the truth about unusual but valid data: a model whose newest version failed
validation, a free-text source_job, a model with no published version, a bundle missing one
eigenvalue tensor, and layers whose head dim or KV heads differ from the model's."""

from __future__ import annotations

import re
import uuid

import numpy as np
from oscar_zoo.zoo.bundle import Bundle, write

from tests.api.ui.conftest import add_job
from tests.api.ui.seeding import make_validated_bundle
from tests.api.ui.test_pages import charts, decode_grid, model_names, sort_header, version_numbers
from tests.utils.bundles import make_bundle, make_manifest, make_tensors
from tests.utils.registry_server import upload_bundle


def row_of(page: str, model: str) -> str:
    row = page[page.index(f'href="/models/{model}"'):]
    return row[:row.index("</tr>")]


def test_validated_only_judges_the_version_the_row_shows(registry_server, tmp_path):
    for seed, passed in ((1, True), (2, False)):       # v1 passed, v2 (latest) failed
        make_validated_bundle(tmp_path / f"b{seed}", seed=seed, passed=passed)
        registry_server.publish_dir(tmp_path / f"b{seed}")
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


def test_orders_count_what_a_pull_gets_and_put_missing_values_last(registry_server, tmp_path):
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
