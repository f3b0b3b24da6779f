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
