"""The settings registry is the one source for env vars, CLI and docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo import settings
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_docs_list_every_setting():
    text = DOC.read_text()
    assert settings.markdown_table() in text, "docs/settings.md is stale: regenerate it (see its header)"


def test_env_overrides_and_types(monkeypatch, sandbox):
    monkeypatch.setenv("OSCAR_ZOO_CALIB_TOKENS", "1234")
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf, modelscope")
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "yes")
    assert settings.get("calib_tokens") == 1234
    assert settings.get("sources") == ["hf", "modelscope"]
    assert settings.is_offline()
    assert settings.get("database_url").startswith("sqlite:///")
    assert settings.get("data_dir") == sandbox / "data"   # the autouse sandbox is in effect


def test_bad_values_say_which_variable(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "many")
    with pytest.raises(ConfigError, match="OSCAR_ZOO_HTTP_RETRIES"):
        settings.get("http_retries")


@pytest.mark.parametrize("env, value, accepted", [
    ("OSCAR_ZOO_OFFLINE", "maybe", "use 1, true, yes or on (any case) to turn it on; 0, false, "
                                   "no, off or empty to turn it off"),
    ("OSCAR_ZOO_HTTP_RETRIES", "1.5", "use a whole number >=0"),
    ("OSCAR_ZOO_HTTP_TIMEOUT", "soon", "use a number >0"),
])
def test_a_value_of_the_wrong_kind_is_told_what_the_kind_accepts(monkeypatch, env, value,
                                                                 accepted):
    """OSCAR_ZOO_OFFLINE=maybe said "is not a valid bool: Serve from the local cache only; never
    touch the network.": the help, where the values it takes belong."""
    s = next(s for s in settings.SETTINGS if s.env == env)
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as e:
        settings.get(s.name)
    assert str(e.value) == f"{env}={value!r} is not a valid {s.kind}: {accepted} ({s.help})"
    for word in ("1", "TRUE", " yes ", "on") if s.kind == "bool" else ():   # what it says works
        monkeypatch.setenv(env, word)
        assert settings.get(s.name) is True
    for word in ("0", "False", "no", "off", "") if s.kind == "bool" else ():
        monkeypatch.setenv(env, word)
        assert settings.get(s.name) is False


@pytest.mark.parametrize("env, value", [
    ("OSCAR_ZOO_HTTP_RETRIES", "-1"),        # zero attempts: an AssertionError traceback
    ("OSCAR_ZOO_HTTP_TIMEOUT", "nan"),       # socket.settimeout's ValueError traceback
    ("OSCAR_ZOO_HTTP_TIMEOUT", "0"),         # every request "cannot reach the registry"
    ("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "0"),
    ("OSCAR_ZOO_JOB_LEASE_SECONDS", "inf"),
])
def test_numbers_out_of_range_are_refused_with_the_range(monkeypatch, env, value):
    name = next(s.name for s in settings.SETTINGS if s.env == env)
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError, match=f"{env}=.*out of range.*{settings.setting(name).bound}"):
        settings.get(name)
    out = CliRunner().invoke(cli, ["pull", "smollm2-135m"])
    assert out.exit_code == 1 and "Traceback" not in out.output


def test_settings_command_shows_every_row_beside_an_invalid_one(monkeypatch):
    """The command a user runs to find a bad variable printed only that error."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "abc")
    out = CliRunner().invoke(cli, ["settings", "--json"])
    rows = {r["env"]: r for r in __import__("json").loads(out.stdout)}
    assert out.exit_code == 1 and len(rows) == len(settings.SETTINGS)
    assert "not a valid int" in rows["OSCAR_ZOO_HTTP_RETRIES"]["invalid"]
    assert rows["OSCAR_ZOO_CALIB_TOKENS"]["value"] == 30000
    human = CliRunner().invoke(cli, ["settings"]).stdout
    assert "INVALID: 'abc'" in human and "None" not in human and "['" not in human


def test_a_cache_dir_that_is_a_file_is_one_line_not_a_traceback(monkeypatch, tmp_path):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("OSCAR_ZOO_CACHE", str(tmp_path / "afile"))
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    out = CliRunner().invoke(cli, ["pull", "smollm2-135m"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert "Not a directory" in out.stderr and "oscar-zoo settings" in out.stderr


def test_settings_command_masks_secrets(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", "ozk_secret_value")
    out = CliRunner().invoke(cli, ["settings", "--json"]).output
    assert "ozk_secret_value" not in out and "OSCAR_ZOO_CACHE" in out


def test_settings_command_masks_passwords_in_urls(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", "postgresql://zoo:S3cretPw@db.internal:5432/zoo")
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "https://alice:tok123@reg.example")
    rows = {r["env"]: r["value"] for r in __import__("json").loads(
        CliRunner().invoke(cli, ["settings", "--json"]).stdout)}
    assert rows["OSCAR_ZOO_DATABASE_URL"] == "postgresql://zoo:***@db.internal:5432/zoo"
    assert rows["OSCAR_ZOO_ENDPOINT"] == "https://alice:***@reg.example"
    human = CliRunner().invoke(cli, ["settings"]).stdout
    assert "S3cretPw" not in human and "tok123" not in human


def test_registry_errors_never_show_the_endpoint_password(monkeypatch):
    """An unreachable registry's error names the endpoint: without its user:password@ part."""
    from oscar_zoo.zoo.errors import OfflineError
    from oscar_zoo.zoo.registry_client import RegistryClient

    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with RegistryClient("http://alice:tok123@127.0.0.1:9") as client:
        with pytest.raises(OfflineError) as e:
            client.model("smollm2-135m")
    assert "alice:***@127.0.0.1:9" in str(e.value) and "tok123" not in str(e.value)


def test_check_names_every_invalid_setting_at_once(monkeypatch):
    """One start tells the operator everything to fix, not one variable per restart."""
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", "abc")
    monkeypatch.setenv("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "0")
    with pytest.raises(settings.SettingError) as e:
        settings.check(settings.SERVICE)
    assert str(e.value).splitlines() == [
        "2 settings are invalid:",
        "  OSCAR_ZOO_MAX_UPLOAD_BYTES='abc' is not a valid int: use a whole number >0 (Largest "
        "request body the registry accepts.)",
        "  OSCAR_ZOO_JOB_MAX_ATTEMPTS='0' is out of range: it must be a finite number >=1 "
        "(Attempts before a job is marked failed.)"]
    assert e.value.http_status == 500     # the server's to fix: never a client's 422


def test_check_passes_valid_values_and_checks_only_the_names_given(monkeypatch):
    settings.check(settings.SERVICE)     # the defaults
    for env, value in [("OSCAR_ZOO_MAX_UPLOAD_BYTES", "1"), ("OSCAR_ZOO_EXECUTOR", "ray"),
                       ("OSCAR_ZOO_WORKERS", "0"), ("OSCAR_ZOO_JOB_CANCEL_GRACE_SECONDS", "0"),
                       ("OSCAR_ZOO_MIRROR_TARGETS", "hf:org/a, glm-*=ms:org/b"),
                       ("OSCAR_ZOO_PUBLIC_URL", "https://zoo:pw@[::1]:8443/")]:
        monkeypatch.setenv(env, value)
    settings.check(settings.SERVICE)
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "maybe")      # a client's setting, not the server's
    settings.check(settings.SERVICE)
    with pytest.raises(settings.SettingError, match="^OSCAR_ZOO_OFFLINE='maybe'"):
        settings.check(["offline"])


@pytest.mark.parametrize("env, value, says", [
    ("OSCAR_ZOO_EXECUTOR", "dask", "OSCAR_ZOO_EXECUTOR='dask' is not one of local, ray"),
    ("OSCAR_ZOO_INT2_BACKEND", "cuda", "'cuda' is not one of auto, triton, vectorized"),
    ("OSCAR_ZOO_MIRROR_TARGETS", "hf:org/a,glm-*=github:org/b",
     "OSCAR_ZOO_MIRROR_TARGETS='hf:org/a,glm-*=github:org/b' is invalid: bad mirror target "
     "'github:org/b'"),
    ("OSCAR_ZOO_PUBLIC_URL", "10.0.0.1:8000", "'10.0.0.1:8000' is invalid: not an http(s) URL"),
    ("OSCAR_ZOO_PUBLIC_URL", "http://zoo:S3cret@host:port", "'http://zoo:***@host:port' is inv"),
])
def test_check_refuses_values_of_the_wrong_form(monkeypatch, env, value, says):
    monkeypatch.setenv(env, value)
    with pytest.raises(settings.SettingError) as e:
        settings.check(settings.SERVICE)
    assert says in str(e.value) and "S3cret" not in str(e.value)


def test_a_bad_mirror_target_is_left_to_the_mirroring_after_startup(monkeypatch):
    """Read after a publish, it must not fail the publish: mirroring records the error."""
    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", "github:org/b")
    assert settings.get("mirror_targets") == ["github:org/b"]


SERVER_CODE = ("api", "registry_db", "calibrate/executors", "calibrate/jobspec.py",
               "calibrate/int2_attention.py", "zoo/mirror")


def test_the_service_list_names_every_setting_the_server_reads():
    """Else a bad value of a setting left off it passes startup and fails requests."""
    root = Path(__file__).resolve().parents[2]
    read = set()
    for where in map(root.joinpath, SERVER_CODE):
        for source in [where] if where.is_file() else where.rglob("*.py"):
            read |= set(re.findall(r"settings\.(?:get|raw)\(\s*[\"'](\w+)[\"']",
                                   source.read_text()))
    assert {"max_upload_bytes", "job_lease_seconds", "mirror_targets"} <= read   # the scan works
    assert read <= set(settings.SERVICE), f"add to settings.SERVICE: {read - set(settings.SERVICE)}"


def test_settings_command_shows_a_boolean_as_its_env_var_is_written(monkeypatch):
    """`settings` showed False/True where docs/settings.md (and every hint: OSCAR_ZOO_OFFLINE=1)
    shows 0/1; --json keeps JSON booleans."""
    import json

    def offline_cell(args=()):
        out = CliRunner().invoke(cli, ["settings", *args])
        assert out.exit_code == 0, out.output
        if args:
            return next(r for r in json.loads(out.stdout) if r["env"] == "OSCAR_ZOO_OFFLINE")["value"]
        return next(line for line in out.stdout.splitlines()
                    if line.startswith("OSCAR_ZOO_OFFLINE ")).split()[1]

    assert "| `OSCAR_ZOO_OFFLINE` | `0` |" in DOC.read_text()
    assert offline_cell() == "0" and offline_cell(["--json"]) is False
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "yes")
    assert offline_cell() == "1" and offline_cell(["--json"]) is True
