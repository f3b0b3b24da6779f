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
from tests.api.ui.test_pages import charts, decode_grid, model_names
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
