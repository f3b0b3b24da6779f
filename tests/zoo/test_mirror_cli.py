"""`oscar-zoo mirror` as a user meets it (click's runner): a failure said once, with the fix;
`--dry-run` planning a run from the hubs' state without writing to them or to the registry.
Real huggingface_hub and modelscope-hub clients against the loopback emulator."""

from __future__ import annotations

import json
import logging
import re
import shlex
from contextlib import contextmanager

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.mirror.runner import mirror_bundle
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import (BUNDLE_FILES, FOLDER, HF, MS, PT_FILES, REPO,  # noqa: F401
                                   TAG, bundles, registry, same_calibration_as)

MODEL = "smollm2-135m"
VERSION_FILES = {f"{FOLDER}/{n}" for n in BUNDLE_FILES + PT_FILES}


def zoo(*args: str):
    return CliRunner().invoke(cli, list(args))


@contextmanager
def logging_as_in_a_shell():
    """No handler on the root logger, as in `oscar-zoo` run from a shell: a warning then
    reaches stderr through logging.lastResort, where pytest's own capture would swallow it."""
    root = logging.getLogger()
    kept = root.handlers[:]
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = kept


def writes(hub) -> list[tuple[str, str]]:
    """The requests that change a hub (get_paths_info is a POST that only reads)."""
    return [(m, p) for m, p in list(hub.log)
            if m in ("PUT", "DELETE", "PATCH") or (m == "POST" and "/paths-info/" not in p)]


# --- a failure, said once ----------------------------------------------------------------------

def test_a_failed_mirror_is_said_once_with_the_command_that_finishes_it(registry, hub, tmp_path):
    """The runner logged each failure as a warning (stderr) and the command printed it again
    in its FAILED line (stdout): one failure read as two, and neither said what to do."""
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    hub.fail("POST", r"/commit/", status=400, hub="hf")
    with logging_as_in_a_shell():
        r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--to", MS)
    assert r.exit_code == 1, r.output
    assert (r.stdout + r.stderr).count("injected 400") == 1, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{HF}  FAILED: ") and "400" in lines[0]
    assert lines[1].startswith(f"{MS}  {FOLDER}  tag {TAG}")      # the other hub went on
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: 1 of 2 targets failed (the reason is on its line above)")
    rerun = re.search(r"`(oscar-zoo mirror [^`]+)`", error).group(1)
    assert rerun == f"oscar-zoo mirror {MODEL}@1 --to {HF}"
    hub.faults.clear()
    r = zoo(*shlex.split(rerun)[1:])      # the command it names finishes the job
    assert r.exit_code == 0 and r.stdout.startswith(f"{HF}  {FOLDER}  tag {TAG}"), r.output
    assert TAG in hub.repo("hf", REPO).tags


def test_with_json_the_failure_is_in_the_json_only(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    hub.fail("POST", r"/commit/", status=400)
    with logging_as_in_a_shell():
        r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--json")
    assert r.exit_code == 1
    rows = json.loads(r.stdout)
    assert [(x["target"], x["status"]) for x in rows] == [("hf", "failed")]
    assert "injected 400" in rows[0]["error"] and "injected 400" not in r.stderr
    assert "in its row of the JSON" in r.stderr


def test_a_background_mirror_still_logs_its_failure(hub, tmp_path, caplog):
    """Only the CLI, which prints each outcome itself, keeps it out of the log; the server's
    mirrors after a publish have nobody else to tell."""
    hub.tokens = {"hf_test", "ms_test"}
    hub.fail("POST", r"/commit/", status=400)
    assert mirror_bundle(make_bundle(tmp_path / "b").path, 1, HF).status == "failed"
    assert f"mirroring {MODEL} v1 to {HF} failed" in caplog.text


# --- --dry-run ---------------------------------------------------------------------------------

def test_a_dry_run_plans_the_upload_and_writes_nothing(registry, hub, tmp_path):
    bundle = make_bundle(tmp_path / "b")
    registry.publish_dir(bundle.path)
    r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--to", MS, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)
    assert [(p["target"], p["repo"], p["model"], p["version"], p["action"], p["create_repo"],
             p["folder"], p["tag"]) for p in plans] == [
        ("hf", REPO, MODEL, 1, "commit and tag", True, FOLDER, TAG),
        ("modelscope", REPO, MODEL, 1, "commit and tag", True, FOLDER, TAG)]
    for p in plans:
        assert set(p["upload"]) == VERSION_FILES | {"oscar-zoo.json", "README.md"}
        assert p["delete"] == [] and p["error"] is None
    assert "dry run" in r.stderr
    assert writes(hub) == [] and hub.repo("hf", REPO) is None and hub.repo("ms", REPO) is None
    with registry.client() as http:    # and the registry recorded no run (not even pending)
        assert http.get(f"/v1/models/{MODEL}/versions/1/mirrors").json()["items"] == []

    # what it planned is what the run does
    assert zoo("mirror", f"{MODEL}@1", "--to", HF, "--to", MS).exit_code == 0
    for kind in ("hf", "ms"):
        repo = hub.repo(kind, REPO)
        assert set(repo.files(TAG)) - {".gitattributes"} == set(plans[0]["upload"])
    # and planned again, there is nothing left to do
    hub.log.clear()
    r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--to", MS, "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        f"{HF}  {MODEL} v1  nothing: the hub already has all of it",
        f"{MS}  {MODEL} v1  nothing: the hub already has all of it"]
    assert writes(hub) == []


def test_a_dry_run_of_an_older_version_shows_its_v_n_subfolder(registry, bundles, hub, tmp_path):
    second = same_calibration_as(bundles[0], tmp_path / "again", seed=7)
    for b in (bundles[0], second):
        registry.publish_dir(b.path)
    assert zoo("mirror", f"{MODEL}@2", "--to", HF).exit_code == 0
    hub.log.clear()
    r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--dry-run")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"{HF}  {MODEL} v1 -> {FOLDER}/v1  tag {TAG}  (would commit and tag)"
    uploads = {line.split()[1] for line in lines[1:] if line.startswith("  upload  ")}
    assert uploads == {f"{FOLDER}/v1/{n}" for n in BUNDLE_FILES + PT_FILES} | {
        "oscar-zoo.json", "README.md"}
    assert writes(hub) == []


def test_a_dry_run_of_a_yanked_version_plans_its_yank_on_the_mirrors(registry, hub, tmp_path):
    from oscar_zoo.registry_db import queries
    from oscar_zoo.registry_db.publish import yank_version

    registry.publish_dir(make_bundle(tmp_path / "b").path)
    assert zoo("mirror", f"{MODEL}@1", "--to", HF).exit_code == 0
    with registry.registry.db.write() as session:   # as the API does, less its background yank
        v = queries.resolve_version(session, queries.resolve_model(session, MODEL), 1)
        yank_version(session, v, "bad clips", None)
    hub.log.clear()
    r = zoo("mirror", f"{MODEL}@1", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    [plan] = json.loads(r.stdout)
    assert (plan["target"], plan["action"], plan["folder"], plan["tag"]) == (
        "hf", "record yank", FOLDER, TAG)
    assert set(plan["delete"]) == VERSION_FILES     # its only version leaves main
    assert set(plan["upload"]) == {"oscar-zoo.json", "README.md"}
    r = zoo("mirror", f"{MODEL}@1", "--to", MS, "--dry-run")    # never mirrored there
    assert r.exit_code == 0 and f"{MS}  {MODEL} v1  skip: {MODEL} v1 was never mirrored to {MS}" in r.stdout
    assert writes(hub) == []
    # and the run does what it said
    assert zoo("mirror", f"{MODEL}@1").exit_code == 0
    assert not set(hub.repo("hf", REPO).files()) & VERSION_FILES


def test_a_dry_run_says_what_would_fail_and_how_to_check_again(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    hub.seed("hf", REPO, {"README.md": b"# someone else's\n"})
    hub.log.clear()
    r = zoo("mirror", f"{MODEL}@1", "--to", HF, "--dry-run")
    assert r.exit_code == 1
    assert r.stdout.startswith(f"{HF}  {MODEL} v1  would FAIL: {HF} is not an oscar-zoo mirror")
    assert f"`oscar-zoo mirror {MODEL}@1 --to {HF} --dry-run` checks again" in r.stderr
    assert writes(hub) == []
    r = zoo("mirror", f"{MODEL}@1", "--dry-run", "--status")
    assert r.exit_code == 2 and "use one of them" in r.stderr
