"""`POST /v1/jobs` refusals name the spec's fields (what the API takes), never the CLI's options
(`oscar-zoo jobs submit` says those: tests/zoo/test_jobs_cli.py)."""

from __future__ import annotations

import pytest

from oscar_zoo.zoo.catalog import ALIAS_RULE


@pytest.fixture
def submitter(registry_server):
    # bundles:publish too: moving aliases needs it (api/routes/jobs.py _check_alias_scope)
    with registry_server.client(registry_server.token("jobs:submit", "bundles:publish",
                                                      name="owner")) as sub:
        yield sub


def _refused(sub, body: dict) -> str:
    r = sub.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert sub.get("/v1/jobs").json()["items"] == []       # nothing queued
    return r.json()["detail"]


def test_a_draft_with_aliases_is_refused(submitter):
    """It was queued; the result stayed a draft and the aliases never moved (record_result
    moves them only for a published version, promote moves none)."""
    said = _refused(submitter, {"model": "smollm2-135m", "publish": False,
                                "aliases": ["beta", "prod"]})
    assert said == ("aliases beta, prod would never move: aliases move only with a published "
                    "version, and publish false keeps this job's version a draft; set publish "
                    "true (or leave it out), or leave aliases out and run `oscar-zoo alias "
                    "smollm2-135m@N beta` after `oscar-zoo promote smollm2-135m@N`")


def test_a_draft_without_aliases_and_a_published_job_with_them_are_accepted(submitter):
    for body in ({"publish": False}, {"aliases": ["beta"]}):
        r = submitter.post("/v1/jobs", json={"model": "smollm2-135m", **body})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize("alias", ["9x", "Prod"])
def test_an_alias_is_told_the_registrys_alias_rule(submitter, alias):
    """`9x` was told "use a lower-case name such as recommended": it is lower case; the rule
    is that it starts with a letter, as `oscar-zoo alias` says."""
    said = _refused(submitter, {"model": "smollm2-135m", "aliases": [alias]})
    assert said == f"alias {alias!r} is not valid: {ALIAS_RULE}"


def test_latest_is_refused_as_moving_by_itself(submitter):
    said = _refused(submitter, {"model": "smollm2-135m", "aliases": ["latest"]})
    assert said.startswith("alias 'latest' always points at the newest published version")


@pytest.mark.parametrize("body, said", [
    ({"seq_len": 256}, "Raise seq_len above 320 (e.g. 2048), or set clip_search false"),
    ({"validation": {"context_len": 100}},
     "validation.context_len 100 must exceed sink 64 + recent 256 = 320; raise "
     "validation.context_len above 320"),
])
def test_the_ways_out_are_the_specs_fields(submitter, body, said):
    told = _refused(submitter, {"model": "smollm2-135m", **body})
    assert said in told and "--" not in told, told
