"""`oscar-zoo settings` as a table: every help text starts in one column, whatever the length of
a value (database_url holds the data dir's whole path), and a float setting shows as
docs/settings.md writes its default (120, not 120.0)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from oscar_zoo.zoo import settings
from oscar_zoo.zoo.cli.main import cli


def _lines(monkeypatch, **env) -> dict[str, str]:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = CliRunner().invoke(cli, ["settings"])
    assert out.exit_code == 0, out.output
    return {line.split()[0]: line for line in out.stdout.splitlines()}


def test_every_help_text_starts_in_one_column(monkeypatch, tmp_path):
    deep = tmp_path / ("a-long-directory-name-" * 4) / "data"
    lines = _lines(monkeypatch, OSCAR_ZOO_DATA_DIR=str(deep))
    starts = {s.env: lines[s.env].index(s.help) for s in settings.SETTINGS}
    assert len(set(starts.values())) == 1, starts
    assert str(deep) in lines["OSCAR_ZOO_DATABASE_URL"]


def test_float_settings_show_as_documented(monkeypatch):
    lines = _lines(monkeypatch)
    value = lambda env: re.split(r"\s{2,}", lines[env])[1]   # noqa: E731
    assert value("OSCAR_ZOO_LOCK_TIMEOUT") == "120" and value("OSCAR_ZOO_HTTP_TIMEOUT") == "30"
    doc = settings.markdown_table()
    assert "| `lock_timeout` | `OSCAR_ZOO_LOCK_TIMEOUT` | `120` |" in doc
    lines = _lines(monkeypatch, OSCAR_ZOO_LOCK_TIMEOUT="2.5")
    assert value("OSCAR_ZOO_LOCK_TIMEOUT") == "2.5"
