"""How a mirror run reports and retries hub errors, and keeps its own stdout clean. Real clients
against the loopback emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from oscar_zoo.zoo.mirror.runner import mirror_bundle
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import HF, MS, REPO, TAG, registry  # noqa: F401 (fixture)


def test_the_hubs_own_reason_is_kept(hub, tmp_path):
    hub.tokens = {"hf_test", "ms_test"}
    hub.fail("POST", r"/commit/", status=400)
    r = mirror_bundle(make_bundle(tmp_path / "b").path, 1, HF)
    assert r.status == "failed" and "400" in r.error
    assert "injected 400" in r.error   # the emulator's message, as the Hub would give its reason


def test_a_permanent_4xx_is_not_retried_a_5xx_is(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "5")
    hub.tokens = {"hf_test", "ms_test"}
    b = make_bundle(tmp_path / "b")
    hub.fail("POST", r"/commit/", status=422)
    assert mirror_bundle(b.path, 1, HF).status == "failed"
    assert len(hub.requests("POST", r"/commit/")) == 1
    hub.faults.clear()
    hub.fail("POST", r"/commit/", status=503, times=1)
    r = mirror_bundle(b.path, 1, HF)
    assert (r.status, r.tag) == ("done", TAG)
    assert len(hub.requests("POST", r"/commit/")) == 3


def test_mirror_json_to_modelscope_is_json(registry, hub, tmp_path):
    """modelscope-hub prints an upload report; it must not land in `--json` output."""
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    p = subprocess.run([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "mirror", "smollm2-135m@1",
                        "--to", MS, "--json"], capture_output=True, text=True,
                       env=os.environ.copy(), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [(r["target"], r["status"]) for r in json.loads(p.stdout)] == [("modelscope", "done")]
    assert hub.repo("ms", REPO).tags


def test_a_token_that_cannot_create_repos_still_mirrors_into_one_that_exists(hub, tmp_path):
    """A fine-grained token may write to one repo of an org but not create repos there: the Hub
    answers the create with 403, and the run goes on into the existing repo. Where the repo does
    not exist, the 403 is the error."""
    hub.tokens = {"hf_test", "ms_test"}
    b = make_bundle(tmp_path / "b")
    for kind in ("hf", "ms"):
        hub.seed(kind, REPO, {})
    hub.fail("POST", r"/api/(repos/create|v1/models)$", status=403)
    for target in (HF, MS):
        r = mirror_bundle(b.path, 1, target)
        assert (r.status, r.tag) == ("done", TAG), r.error
    for kind in ("hf", "modelscope"):
        r = mirror_bundle(b.path, 1, f"{kind}:oscar-zoo/elsewhere")
        assert r.status == "failed" and "403" in r.error, r.error
    assert hub.repo("hf", "oscar-zoo/elsewhere") is None and hub.repo("ms", "oscar-zoo/elsewhere") is None


def test_a_rate_limit_that_outlasts_the_retries_says_to_wait_and_rerun(hub, tmp_path):
    """"429 from the hub (Too Many Requests)" alone does not say that the fix is to wait, nor
    that running the mirror again will not duplicate what landed."""
    hub.tokens = {"hf_test", "ms_test"}
    b = make_bundle(tmp_path / "b")
    hub.fail("POST", r"/commit/", status=429)
    for target in (HF, MS):
        r = mirror_bundle(b.path, 1, target)
        assert r.status == "failed" and "429" in r.error, r.error
        assert "rate-limiting" in r.error and "oscar-zoo mirror smollm2-135m@1" in r.error
