"""Only published versions reach the hubs, a yank follows them there, and a promoted draft is
mirrored like a publish. Real clients against the loopback emulator, a real registry server."""

from __future__ import annotations

import json
import time

import pytest

from oscar_zoo.registry_db.mirrors import NotPublished, mirror_version, mirror_yank
from oscar_zoo.zoo.pull import pull
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import HF, MS, REPO, TAG, registry  # noqa: F401 (fixture)


def hub_slot(hub, kind: str = "hf") -> dict:
    return json.loads(hub.repo(kind, REPO).files()["oscar-zoo.json"][0])["models"]["smollm2-135m"]


def wait_for(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def test_a_draft_is_not_mirrored(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path, status="draft")
    with pytest.raises(NotPublished, match=r"draft.*oscar-zoo promote smollm2-135m@1"):
        mirror_version(registry.registry, "smollm2-135m", 1, [HF])
    assert hub.repo("hf", REPO) is None


def test_a_yanked_version_is_not_mirrored(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    with registry.client(token=registry.token("bundles:publish")) as c:
        assert c.post("/v1/models/smollm2-135m/versions/1/yank",
                      json={"reason": "clip search bug"}).status_code == 200
    with pytest.raises(NotPublished, match="yanked .clip search bug."):
        mirror_version(registry.registry, "smollm2-135m", 1, [HF])
    assert hub.repo("hf", REPO) is None


def test_a_yank_reaches_the_mirror_and_pull_skips_it_for_latest(registry, hub, tmp_path,
                                                               monkeypatch):
    bundles = [make_bundle(tmp_path / f"b{i}", seed=i) for i in range(2)]
    for n, b in enumerate(bundles, 1):
        registry.publish_dir(b.path)
        assert [r.status for r in mirror_version(registry.registry, "smollm2-135m", n,
                                                 [HF, MS])] == ["done", "done"]
    with registry.client(token=registry.token("bundles:publish")) as c:
        r = c.post("/v1/models/smollm2-135m/versions/2/yank", json={"reason": "broken"})
        assert r.status_code == 200 and r.json()["status"] == "yanked"
    for kind in ("hf", "ms"):
        slot = wait_for(lambda: (s := hub_slot(hub, kind))["versions"]["2"].get("yanked") and s,
                        f"the yank on {kind}")
        assert slot["versions"]["2"]["yank_reason"] == "broken" and slot["latest"] == 1
        readme = hub.repo(kind, REPO).files()["README.md"][0].decode()
        assert "| smollm2-135m | 2 (yanked) |" in readme
    for kind, setting in (("hf", "OSCAR_ZOO_HF_MIRROR_REPO"),
                          ("modelscope", "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO")):
        monkeypatch.setenv(setting, REPO)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", kind)
        latest = pull("smollm2-135m")
        assert (latest.source, latest.version, latest.digest) == (kind, 1, bundles[0].digest)
        yanked = pull("smollm2-135m@2")
        assert yanked.digest == bundles[1].digest
        assert any("yanked: broken" in n.text for n in yanked.notes), yanked.notes


def test_a_yank_that_failed_to_reach_a_hub_is_recorded_and_retried(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    mirror_version(registry.registry, "smollm2-135m", 1, [HF])
    hub.fail("POST", r"/commit/", status=500)
    from oscar_zoo.registry_db.publish import yank_version
    from oscar_zoo.registry_db import queries

    with registry.registry.db.write() as s:
        v = queries.resolve_version(s, queries.resolve_model(s, "smollm2-135m"), 1)
        yank_version(s, v, "bad", "tester")
    assert mirror_yank(registry.registry, "smollm2-135m", 1)[0].status == "failed"
    with registry.client() as http:
        item, = http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert item["status"] == "done" and "oscar-zoo mirror smollm2-135m@1" in item["error"]
    assert not hub_slot(hub)["versions"]["1"].get("yanked")
    hub.faults.clear()
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    out = CliRunner().invoke(cli, ["mirror", "smollm2-135m@1"])
    assert out.exit_code == 0, out.output
    assert "yank recorded" in out.output
    assert hub_slot(hub)["versions"]["1"]["yanked"] is True and hub_slot(hub)["latest"] is None
    with registry.client() as http:
        item, = http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert item["status"] == "done" and item["error"] is None


def test_a_promoted_draft_is_mirrored_to_the_configured_targets(registry, hub, tmp_path,
                                                                monkeypatch):
    from tests.utils.registry_server import upload_bundle

    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", HF)
    with registry.client(token=registry.token("bundles:publish")) as c:
        assert upload_bundle(c, make_bundle(tmp_path / "b").path, status="draft").status_code == 201
        assert c.post("/v1/models/smollm2-135m/versions/1/publish").status_code == 200
        records = wait_for(lambda: [r for r in c.get("/v1/models/smollm2-135m/versions/1/mirrors")
                                    .json()["items"] if r["status"] != "pending"], "the mirror")
    assert [(r["target"], r["status"]) for r in records] == [("hf", "done")]
    assert TAG in hub.repo("hf", REPO).tags


def _yanked(registry, tmp_path, reason: str = "clip search bug") -> None:
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    with registry.client(token=registry.token("bundles:publish")) as c:
        assert c.post("/v1/models/smollm2-135m/versions/1/yank",
                      json={"reason": reason}).status_code == 200


def test_a_yanked_version_never_mirrored_to_a_target_has_no_yank_to_record_there(registry, hub,
                                                                                 tmp_path):
    """`--status` said "not mirrored anywhere yet", and `mirror --to` then tried to record the
    yank on that hub, and reported it FAILED."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    _yanked(registry, tmp_path)
    run = CliRunner().invoke
    assert run(cli, ["mirror", "smollm2-135m@1", "--status"]).stdout.strip() == \
        "not mirrored anywhere yet"
    hub.fail("GET", r".*", status=500)      # the hub is not asked at all
    out = run(cli, ["mirror", "smollm2-135m@1", "--to", HF])
    assert out.exit_code == 0, out.output
    assert "FAILED" not in out.output
    assert (f"hf:{REPO}  skipped: smollm2-135m v1 was never mirrored to hf:{REPO}" in out.stdout
            and "no yank to record" in out.stdout)
    assert hub.repo("hf", REPO) is None
    got = json.loads(run(cli, ["mirror", "smollm2-135m@1", "--to", HF, "--json"]).stdout)
    assert [(r["status"], r["error"]) for r in got] == [("skipped", None)]
    out = run(cli, ["mirror", "smollm2-135m@1"])
    assert out.exit_code == 0 and "no mirror holds this version" in out.stdout, out.output


def test_a_yank_reaches_the_target_that_holds_the_version_and_skips_the_other(registry, hub,
                                                                             tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    assert mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].status == "done"
    from oscar_zoo.registry_db import queries
    from oscar_zoo.registry_db.publish import yank_version

    with registry.registry.db.write() as s:   # no background yank: this call does it
        v = queries.resolve_version(s, queries.resolve_model(s, "smollm2-135m"), 1)
        yank_version(s, v, "bad", "tester")
    results = mirror_yank(registry.registry, "smollm2-135m", 1, [HF, MS])
    assert [(r.target, r.status, r.committed) for r in results] == [
        ("hf", "done", True), ("modelscope", "skipped", False)]
    assert hub_slot(hub)["versions"]["1"]["yanked"] is True
    assert hub.repo("ms", REPO) is None
