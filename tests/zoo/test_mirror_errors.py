"""How a mirror run reports and retries hub errors (and how long it waits: the hub's
Retry-After), and keeps its own stdout clean. Real clients against the loopback emulator."""

from __future__ import annotations

import email.utils
import errno
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from oscar_zoo.zoo.mirror.runner import mirror_bundle
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import HF, MS, REPO, TAG, registry  # noqa: F401 (fixture)


def test_the_hubs_own_reason_is_kept(hub, tmp_path):
    hub.tokens = {"hf_test", "ms_test"}
    hub.fail("POST", r"/commit/", status=400)
    r = mirror_bundle(make_bundle(tmp_path / "b").path, 1, HF)
    assert r.status == "failed" and "400" in r.error
    assert "injected 400" in r.error   # the emulator's message, as the Hub would give its reason


def test_a_permanent_4xx_is_not_retried_a_5xx_is(hub, tmp_path, monkeypatch, caplog):
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
    # each retry said (a warning: stderr), as a hub that is down kept `mirror` silent for minutes
    retries = [r for r in caplog.records if "retry 1 of 5 in" in r.getMessage()]
    assert len(retries) == 1 and retries[0].levelname == "WARNING", caplog.text


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


# --- Retry-After ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [HF, MS])
def test_a_429_with_retry_after_is_waited_out_before_the_retry(hub, tmp_path, target):
    """Our own first backoff is 0.5 s at most 0.625: a retry a second after the refusal came
    from the hub's Retry-After. Timed by the emulator, with real sleeps."""
    hub.tokens = {"hf_test", "ms_test"}
    hub.fail("POST", r"/commit/", status=429, times=1, retry_after=1)
    r = mirror_bundle(make_bundle(tmp_path / "b").path, 1, target)
    assert (r.status, r.tag) == ("done", TAG), r.error
    refused = [i for i, x in enumerate(hub.exchanges) if x.status == 429]
    assert len(refused) == 1
    refusal, retry = hub.exchanges[refused[0]], hub.exchanges[refused[0] + 1]
    assert retry.arrived - refusal.answered >= 0.98, (refusal, retry)


def _http_date(seconds_from_now: float) -> str:
    return email.utils.format_datetime(
        datetime.now(timezone.utc) + timedelta(seconds=seconds_from_now), usegmt=True)


@pytest.mark.parametrize("target, status, seconds, as_date, said", [
    (HF, 429, 600, False, "asked to wait 10 min"),
    (MS, 429, 600, False, "asked to wait 10 min"),
    (HF, 429, 3 * 3600, True, "asked to wait 3.0 h"),
    (HF, 503, 900, False, "asked to wait 15 min"),
])
def test_a_hub_asking_for_a_longer_wait_than_the_cap_fails_at_once_naming_it(
        hub, tmp_path, target, status, seconds, as_date, said):
    """Sitting out minutes of throttling would look like a hung mirror; the failure says how
    long the hub asked for, and that re-running then is safe."""
    hub.tokens = {"hf_test", "ms_test"}
    hub.fail("POST", r"/commit/", status=status,
             retry_after=_http_date(seconds) if as_date else seconds)
    t0 = time.monotonic()
    r = mirror_bundle(make_bundle(tmp_path / "b").path, 1, target)
    assert time.monotonic() - t0 < 10
    assert r.status == "failed" and said in r.error, r.error
    assert "oscar-zoo mirror smollm2-135m@1" in r.error
    assert ("rate-limiting" in r.error) == (status == 429)
    assert len(hub.requests("POST", r"/commit/")) == 1   # no retry at all


def test_a_full_tmpdir_does_not_stop_a_mirror(registry, hub, tmp_path):
    """The version's files were copied into a TemporaryDirectory before any record was made: a
    TMPDIR on a full filesystem of its own (the blobs cannot be hard-linked across, so they are
    copied) made the background mirror a traceback in the log, and no record said it failed.
    They are staged in the registry's data dir now, beside the blobs. On a real full disk: a
    64 KB tmpfs as TMPDIR, in a user namespace of its own, for the mirror run in a child."""
    from tests.utils.full_disk import run_on_a_tiny_tmpfs

    registry.publish_dir(make_bundle(tmp_path / "b").path)
    tmpdir, out = tmp_path / "tmpdir", tmp_path / "results.json"
    code = ("import json, sys; from oscar_zoo.registry_db.registry import open_registry; "
            "from oscar_zoo.registry_db.mirrors import mirror_version; "
            "r = open_registry(); "
            f"res = mirror_version(r, 'smollm2-135m', 1, ['{HF}']); "
            f"open('{out}', 'w').write(json.dumps([x.to_dict() for x in res]))")
    proc = run_on_a_tiny_tmpfs(tmpdir, f'head -c 60000 /dev/zero > "{tmpdir}/filler"; '  # what
                               f'"{sys.executable}" -c "{code}"',      # little it had, taken
                               {**os.environ, "TMPDIR": str(tmpdir)}, 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["target"], r["status"], r["tag"]) for r in json.loads(out.read_text())] == [
        ("hf", "done", TAG)]
    assert TAG in hub.repo("hf", REPO).tags
    staging = registry.data_dir / "staging"
    assert not staging.exists() or list(staging.iterdir()) == []


def test_a_data_dir_too_full_to_stage_in_records_each_target_failed(registry, hub, tmp_path,
                                                                    monkeypatch, caplog):
    """Where even the registry's data dir has no room for the staging dir (a directory takes a
    block), every target is recorded failed with the reason and the fix, and nothing reaches a
    hub; before, nothing was recorded at all. Simulated at os.mkdir, which tempfile.mkdtemp
    calls: a disk full to the last block cannot be made in a test run in general
    (tests/utils/full_disk.py)."""
    from oscar_zoo.registry_db.mirrors import mirror_version

    results = _mirror_with_staging_mkdir_failing(registry, tmp_path, monkeypatch, OSError,
                                                 errno.ENOSPC, [HF, MS])
    says = ("out of disk space in the registry's data dir (No space left on device) while "
            "staging smollm2-135m v1's files for its mirrors; nothing was sent to the hubs.")
    assert [(r.target, r.status) for r in results] == [("hf", "failed"), ("modelscope", "failed")]
    assert all(r.error.startswith(says) for r in results), results[0].error
    assert "`oscar-zoo mirror smollm2-135m@1`" in results[0].error
    with registry.client() as http:
        items = http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert sorted((i["target"], i["status"]) for i in items) == [("hf", "failed"),
                                                                 ("modelscope", "failed")]
    assert all(i["error"].startswith(says) for i in items)
    assert hub.repo("hf", REPO) is None and hub.repo("ms", REPO) is None
    assert "Traceback" not in caplog.text and says in caplog.text
    # room made: the same run mirrors it
    again = mirror_version(registry.registry, "smollm2-135m", 1, [HF])
    assert [r.status for r in again] == ["done"]


def test_a_staging_dir_that_cannot_be_made_keeps_the_data_dir_out_of_the_public_record(
        registry, hub, tmp_path, monkeypatch, caplog):
    """Another error than a full disk (here EACCES, simulated at os.mkdir as above) was
    recorded as str(e), which holds the staging path: the mirror records are public (GET
    .../mirrors), the server's data dir is not. The log, the operator's, still names it."""
    results = _mirror_with_staging_mkdir_failing(registry, tmp_path, monkeypatch, PermissionError,
                                                 errno.EACCES, [HF])
    staging = str(registry.data_dir / "staging")
    assert [r.status for r in results] == ["failed"]
    assert "PermissionError: Permission denied" in results[0].error
    assert str(registry.data_dir) not in results[0].error
    assert staging in caplog.text


def _mirror_with_staging_mkdir_failing(registry, tmp_path, monkeypatch, error, code, targets):
    """Mirror smollm2-135m v1 (published here) while making a dir under the registry's staging
    dir raises error(code): simulated at os.mkdir, which tempfile.mkdtemp calls."""
    from oscar_zoo.registry_db.mirrors import mirror_version

    registry.publish_dir(make_bundle(tmp_path / "b").path)
    real_mkdir, staging = os.mkdir, str(registry.data_dir / "staging")

    def failing(path, *args, **kwargs):
        if os.fspath(path).startswith(staging + os.sep):
            raise error(code, os.strerror(code), path)
        return real_mkdir(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "mkdir", failing)
        return mirror_version(registry.registry, "smollm2-135m", 1, targets)


def test_a_modelscope_mirror_that_cannot_be_reached_does_not_suggest_the_cache(tmp_path,
                                                                                cache_root,
                                                                                monkeypatch):
    """Its listings and tags go through the hub reads pull uses, whose connection errors said
    "set OSCAR_ZOO_OFFLINE=1 to read only the local cache" with a bundle cached; offline mode serves
    no mirror's reads (nor its writes), so the hint could only send the user the wrong way."""
    from oscar_zoo.zoo.errors import OfflineError
    from oscar_zoo.zoo.mirror.modelscope import ModelScopeTarget

    b = make_bundle(tmp_path / "b")
    (cache_root / "models" / "smollm2-135m" / "snapshots" / b.digest).mkdir(parents=True)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    target = ModelScopeTarget(REPO)
    for read in (target.tags, lambda: target.paths("master"),
                 lambda: target.hashes(["oscar-zoo.json"], "master"),
                 lambda: target.listdir("smollm2-135m", "master"),
                 lambda: target.read("oscar-zoo.json", "master")):
        with pytest.raises(OfflineError) as e:
            read()
        assert "cannot reach http://127.0.0.1:9" in str(e.value), e.value
        assert "OSCAR_ZOO_OFFLINE" not in str(e.value), e.value
    r = mirror_bundle(b.path, 1, MS)
    assert r.status == "failed" and "cannot reach" in r.error and "OFFLINE" not in r.error
