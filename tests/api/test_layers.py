"""The layer index over HTTP, checked against the tensors of the bundle that was published."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load

from oscar_zoo.zoo.bundle import read
from tests.utils.bundles import make_bundle


@pytest.fixture(params=[False, True], ids=["per-layer", "per-head"])
def indexed(request, registry_server, tmp_path):
    make_bundle(tmp_path / "b", per_head=request.param, centered=True, seed=3)
    registry_server.publish_dir(tmp_path / "b")
    with registry_server.client() as http:
        yield http, read(tmp_path / "b"), request.param


def test_one_layer_json_matches_bundle(indexed):
    http, bundle, per_head = indexed
    body = http.get("/v1/models/smollm2-135m/versions/1/layers/7").json()
    assert set(body["sides"]) == {"k", "v"}
    for side in ("k", "v"):
        got, want = body["sides"][side], bundle.side(side)[7]
        np.testing.assert_array_equal(np.array(got["rotation"], np.float32), want.rotation)
        np.testing.assert_array_equal(np.array(got["clip"], np.float32), want.clip)
        np.testing.assert_array_equal(np.array(got["eigenvalues"], np.float32), want.eigenvalues)
        assert (got["mean"] is None) == (side == "v")
        assert [h["kv_head"] for h in got["heads"]] == [0, 1, 2]


def test_one_head_json_and_raw(indexed):
    http, bundle, per_head = indexed
    want = bundle.k[4]
    body = http.get("/v1/models/smollm2-135m/versions/1/layers/4",
                    params={"side": "k", "head": 2}).json()
    k = body["sides"]["k"]
    rot = want.rotation[2] if per_head else want.rotation
    np.testing.assert_array_equal(np.array(k["rotation"], np.float32), rot)
    assert k["clip"] == pytest.approx(float(want.clip[2]))
    np.testing.assert_array_equal(np.array(k["mean"], np.float32), want.mean[2])
    eig = want.eigenvalues[2] if per_head else want.eigenvalues
    assert k["heads"][0]["eig_max"] == pytest.approx(float(eig.max()))

    r = http.get("/v1/models/smollm2-135m/versions/1/layers/4",
                 params={"side": "k", "head": 2, "format": "raw"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    shape = tuple(int(x) for x in r.headers["x-tensor-shape"].split(","))
    np.testing.assert_array_equal(np.frombuffer(r.content, "<f4").reshape(shape), rot)

    # The index's byte range is the same matrix, fetched with a Range request on the file.
    start, end = k["heads"][0]["byte_range"]
    part = http.get("/v1/models/smollm2-135m/versions/1/files/rotations.safetensors",
                    headers={"Range": f"bytes={start}-{end - 1}"})
    np.testing.assert_array_equal(np.frombuffer(part.content, "<f4").reshape(rot.shape), rot)


def test_layer_range_as_safetensors(indexed):
    http, bundle, per_head = indexed
    r = http.get("/v1/models/smollm2-135m/versions/1/layers.safetensors",
                 params={"layers": "0-2,10,28-40"})
    assert r.status_code == 200
    assert int(r.headers["content-length"]) == len(r.content)
    tensors = load(r.content)
    layers = sorted({int(k.split(".")[1]) for k in tensors})
    assert layers == [0, 1, 2, 10, 28, 29]
    for key, arr in tensors.items():
        side, layer, kind = key.split(".")
        np.testing.assert_array_equal(arr, getattr(bundle.side(side)[int(layer)], kind))
    only_v = load(http.get("/v1/models/smollm2-135m/versions/1/layers.safetensors",
                           params={"layers": "5", "side": "v"}).content)
    assert sorted(only_v) == ["v.5.clip", "v.5.eigenvalues", "v.5.rotation"]


ERRORS = [
    ("layers/30", {}, 404), ("layers/3", {"head": 3}, 404), ("layers/3", {"side": "q"}, 422),
    ("layers/3", {"format": "raw"}, 422), ("layers/-1", {}, 404),
    ("layers.safetensors", {"layers": "5-2"}, 422), ("layers.safetensors", {"layers": "x"}, 422),
    ("layers.safetensors", {"layers": "31"}, 404), ("layers.safetensors", {"layers": "40-50"}, 404),
    ("layers.safetensors", {}, 422),
    # Unicode digits: str.isdigit() accepts them, int() does not ("²") or reads them ("٣").
    ("layers.safetensors", {"layers": "\u00b2"}, 422), ("layers.safetensors", {"layers": "1-\u0663"}, 422),
]


def test_layer_errors(indexed):
    http, _, _ = indexed
    for path, params, status in ERRORS:
        r = http.get(f"/v1/models/smollm2-135m/versions/1/{path}", params=params)
        assert r.status_code == status, (path, params, r.text)
        assert r.headers["content-type"] == "application/problem+json"


def test_full_index(indexed):
    http, bundle, per_head = indexed
    body = http.get("/v1/models/smollm2-135m/versions/1/layers").json()
    assert len(body["items"]) == 30 * 3 * 2
    assert body["granularity"] == ("kv_head" if per_head else "layer")
    ranges = {(i["side"], i["layer"], i["kv_head"]): tuple(i["byte_range"]) for i in body["items"]}
    # Per-head bundles give each head its own bytes; per-layer ones share one matrix.
    assert (ranges["k", 0, 0] != ranges["k", 0, 1]) == per_head


@pytest.mark.parametrize("spec, says", [
    ("0-1000000", "layer numbers go up to 100000; this version's layers are 0 to 29"),
    ("5-3", "start must not exceed end"),
])
def test_a_bad_layer_range_says_what_is_wrong_with_it(spec, says):
    """A range past the largest layer number was refused as if its start exceeded its end."""
    from oscar_zoo.api.routes.layers import parse_layers
    from oscar_zoo.zoo.errors import InvalidInput

    with pytest.raises(InvalidInput) as e:
        parse_layers(spec, list(range(30)))
    assert says in str(e.value)
