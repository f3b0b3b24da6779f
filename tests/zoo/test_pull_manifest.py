"""What pull does with a manifest a source serves before it trusts any of it: the files it lists
decide what gets fetched and linked, so a listing that could stand in for the hashed manifest,
or that is not a listing at all, stops the pull with nothing cached. No network: every file the
manifests name is put in the cache first, and the URLs point at a closed port."""

from __future__ import annotations

import hashlib
import json

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.errors import BundleFormatError, IntegrityError
from oscar_zoo.zoo.manifest import parse_manifest
from oscar_zoo.zoo.pull import materialize
from oscar_zoo.zoo.sources.base import Plan
from oscar_zoo.zoo.sources.download import RemoteFile, fetch
from tests.utils.bundles import make_bundle


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_for(raw: bytes) -> Plan:
    return Plan(source="registry", model="smollm2-135m", origin="test-source", kind="bundle",
                digest=sha(raw), refs=["latest"], manifest=raw,
                locate=lambda n, s, z: RemoteFile(n, url="http://127.0.0.1:9/closed", sha256=s,
                                                  size=z))


@pytest.fixture
def cached(tmp_path):
    """A cache holding every file of two bundles, and the first bundle's manifest as a dict."""
    cache = Cache(tmp_path / "cache")
    cache.ensure()
    for seed in (0, 1):
        for p in make_bundle(tmp_path / f"b{seed}", seed=seed).path.iterdir():
            cache.add_bytes(p.read_bytes(), sha(p.read_bytes()))
    return cache, json.loads((tmp_path / "b0" / "bundle.json").read_bytes()), tmp_path


def test_a_manifest_listing_a_bundle_json_of_its_own_is_refused(cached):
    cache, manifest, tmp = cached
    other = (tmp / "b1" / "bundle.json").read_bytes()    # valid, and already in the cache
    manifest["files"].append({"name": "bundle.json", "sha256": sha(other), "size": len(other)})
    raw = json.dumps(manifest).encode()
    with pytest.raises(BundleFormatError, match="lists itself"):
        materialize(plan_for(raw), cache, progress=False)
    assert not list((cache.root / "models").glob("*/snapshots/*"))
    with pytest.raises(BundleFormatError, match="lists itself"):
        parse_manifest(raw)


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"files": [{"name": "README.md"}]}',
                                 b'{"files": [{"name": "a", "sha256": "x", "size": "1"}]}'])
def test_a_manifest_that_is_no_listing_is_a_format_error_not_a_traceback(cached, raw):
    cache, _, _ = cached
    with pytest.raises(BundleFormatError, match="test-source"):
        materialize(plan_for(raw), cache, progress=False)
    assert not cache.has_blob(sha(raw))


def test_an_empty_file_is_fetched_without_a_request(tmp_path):
    cache = Cache(tmp_path / "cache")
    empty = RemoteFile("README.md", url="http://127.0.0.1:9/closed", sha256=sha(b""), size=0)
    assert fetch(empty, cache, progress=False) == sha(b"")
    assert cache.blob(sha(b"")).read_bytes() == b""
    wrong = RemoteFile("README.md", url="http://127.0.0.1:9/closed", sha256=sha(b"x"), size=0)
    with pytest.raises(IntegrityError, match="sha256"):
        fetch(wrong, cache, progress=False)
