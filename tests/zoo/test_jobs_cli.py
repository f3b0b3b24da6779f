"""`oscar-zoo jobs` input checks that need no registry."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli


@pytest.mark.parametrize("text, why", [("{model: qwen3-8b}", "is not JSON"),
                                       ('["qwen3-8b"]', "must hold a JSON object")])
def test_a_bad_spec_file_is_a_usage_error(tmp_path, monkeypatch, text, why):
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")  # never reached
    spec = tmp_path / "job.json"
    spec.write_text(text)
    result = CliRunner().invoke(cli, ["jobs", "submit", "--spec", str(spec)])
    assert result.exit_code == 2 and "--spec" in result.stderr and why in result.stderr, result.output


def test_a_job_id_cannot_reach_another_endpoint(tmp_path, monkeypatch, hub):
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        for cmd in ("status", "cancel"):  # ../models/x was the model's detail page
            result = CliRunner().invoke(cli, ["jobs", cmd, "../models/glm-4.7-fp8"])
            assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
            assert result.stderr.startswith("Error: registry") and "/docs" in result.stderr


def test_submit_warns_when_no_worker_seen_lately_can_run_the_job(tmp_path, monkeypatch, hub):
    import json

    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", server.token("jobs:submit"))
        result = CliRunner().invoke(cli, ["jobs", "submit", "glm-4.7-fp8"])   # 8 GPUs
        assert result.exit_code == 0, result.output
        assert "cannot start yet: no worker has asked for work" in result.stderr
        assert "waiting     no worker has asked" in result.stdout
        job_id = result.stdout.split()[1]
        server.client(server.token("jobs:work")).post(
            "/v1/workers/claim", json={"worker": "w", "gpus": 2}).raise_for_status()
        shown = CliRunner().invoke(cli, ["jobs", "status", job_id, "--json"])
        assert "needs 8 GPUs" in json.loads(shown.stdout)["waiting"], shown.output


@pytest.fixture
def submitting(tmp_path, monkeypatch, hub):
    """`oscar-zoo jobs submit ARGS` against a real registry, with a jobs:submit token."""
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", server.token("jobs:submit"))
        yield lambda *args: CliRunner().invoke(cli, ["jobs", "submit", *args])


@pytest.mark.parametrize("args, said", [
    (["--tokens", "99999999999"], "--tokens: Input should be less than or equal to 1073741824"),
    (["--context-len", "8"], "--context-len: Input should be greater than or equal to 16"),
    (["--validation-windows", "0"], "--validation-windows: Input should be greater than or equal"),
    (["--gpus", "65"], "--gpus: Input should be less than or equal to 64"),
])
def test_a_refused_option_is_named_as_the_user_typed_it(submitting, args, said):
    """It was `body.tokens: Input should be ...`: the API's field path, for an option."""
    result = submitting("smollm2-135m", *args)
    assert result.exit_code == 1, result.output
    assert said in result.stderr and "body." not in result.stderr, result.stderr
    assert result.stderr.startswith("Error: registry http://127.0.0.1:")


def test_a_refused_field_of_the_spec_file_keeps_the_registrys_words(submitting, tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text('{"model": "smollm2-135m", "tokens": 99999999999}')
    result = submitting("--spec", str(spec), "--seq-len", "512")
    assert result.exit_code == 1, result.output
    assert "body.tokens: Input should be less than or equal to 1073741824" in result.stderr


def test_an_item_of_a_repeated_option_is_named_with_its_value():
    from oscar_zoo.zoo.cli.jobs_cmds import _in_option_words
    from oscar_zoo.zoo.errors import InvalidInput

    given = {"data": ["builtin:pydoc", "hf:x"], "tokens": 5}
    told = _in_option_words(InvalidInput("registry http://r: body.data.1: bad source"), given)
    assert str(told) == "registry http://r: --data 'hf:x': bad source"
    told = _in_option_words(InvalidInput("registry http://r: body.tokens: too few"), given)
    assert str(told) == "registry http://r: --tokens: too few"
    for unchanged in ("registry http://r: body.seq_len: too long",      # not from an option
                      "registry http://r: k_clip 2 must be at most 1"):  # no option sets it
        assert str(_in_option_words(InvalidInput(unchanged), given)) == unchanged


def test_a_draft_with_an_alias_is_refused_in_the_options_words(submitting):
    """`--draft --alias beta` was queued: the job's version stayed a draft, and the alias was
    silently never moved, neither by the result nor at promote."""
    result = submitting("smollm2-135m", "--draft", "--alias", "beta")
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert said.startswith("Error: registry http://127.0.0.1:"), said
    assert ("alias beta would never move: aliases move only with a published version, and "
            "--draft keeps this job's version a draft; drop --draft, or leave --alias out and run "
            "`oscar-zoo alias smollm2-135m@N beta` after `oscar-zoo promote smollm2-135m@N`") in said
    assert "publish" not in said.replace("published", "")


def test_a_draft_with_an_alias_from_a_spec_file_is_told_in_the_files_words(submitting, tmp_path):
    """`publish: false` and `aliases` in --spec were told to "drop --draft, or leave --alias
    out": options the user never passed."""
    spec = tmp_path / "job.json"
    spec.write_text('{"model": "smollm2-135m", "publish": false, "aliases": ["beta"]}')
    result = submitting("--spec", str(spec))
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert "set publish true (or leave it out), or leave aliases out" in said, said
    assert "--draft" not in said and "--alias" not in said


def test_an_alias_not_starting_with_a_letter_is_told_the_alias_rule(submitting):
    """`--alias 9x` was told "use a lower-case name such as recommended": 9x is lower case."""
    from oscar_zoo.zoo.catalog import ALIAS_RULE

    result = submitting("smollm2-135m", "--alias", "9x")
    assert result.exit_code == 1, result.output
    assert f"alias '9x' is not valid: {ALIAS_RULE}" in " ".join(result.stderr.split())


@pytest.mark.parametrize("args, said, unsaid", [
    (["--seq-len", "256"],
     "--seq-len 256 leaves no INT2 keys for the clip search: its windows must be longer than the "
     "BF16 sink 64 + recent 256 = 320 tokens (--sink-tokens and --recent-tokens; by default how "
     "OSCAR serves the model). Raise --seq-len above 320 (e.g. 2048), or pass --no-clip-search "
     "to use the fixed k_clip / v_clip instead", ("clip_search", "seq_len", "sink_tokens")),
    (["--context-len", "100"],
     "--context-len 100 must exceed sink 64 + recent 256 = 320; raise --context-len above 320",
     ("validation.context_len", "job spec")),
    (["--group-size", "48"], "--group-size 48 must be a power of two", ("group_size",)),
])
def test_the_ways_out_of_a_refusal_are_the_options_of_submit(submitting, args, said, unsaid):
    """`--seq-len 256` ended "or set clip_search false": a spec field, where the option is
    --no-clip-search (`oscar-zoo calibrate` says "pass --no-clip-search")."""
    result = submitting("smollm2-135m", *args)
    assert result.exit_code == 1, result.output
    told = " ".join(result.stderr.split())
    assert said in told and not any(word in told for word in unsaid), told
