"""`NAME@` (nothing after '@': a `NAME@$VERSION` whose variable was empty) is refused by pull
and show as `cache rm` refuses it, instead of getting the default version."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import InvalidInput
from oscar_zoo.zoo.sources.base import parse_spec

GLM = "glm-4.7-fp8"


@pytest.mark.parametrize("args", [["pull", f"{GLM}@"], ["show", f"{GLM}@"],
                                  ["export", f"{GLM}@", "--out", "x"], ["pull", f" {GLM}@ "]])
def test_pull_show_and_export_refuse_an_empty_ref(args, sandbox, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")    # a refusal before any network or cache read
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert f"'{GLM}@' names no bundle after '@': give {GLM} alone for its default version " \
           f"(recommended, else latest), or {GLM}@VERSION or @ALIAS" in result.stderr


def test_the_wording_is_cache_rms(sandbox):
    """One phrasing for both: `cache rm` words what NAME alone and the refs mean to it."""
    told = CliRunner().invoke(cli, ["cache", "rm", f"{GLM}@"]).stderr
    with pytest.raises(InvalidInput) as e:
        parse_spec(f"{GLM}@")
    head = f"'{GLM}@' names no bundle after '@': give {GLM} alone "
    assert head in told and str(e.value).startswith(head)


def test_names_and_refs_still_parse():
    assert parse_spec(GLM)[1].is_default
    assert parse_spec(f"{GLM}@3")[1].version == 3
    assert parse_spec("zai-org/GLM-4.7-FP8@recommended")[1].alias == "recommended"


def test_a_version_ref_reads_in_any_case_as_the_registry_reads_it():
    # the registry's names_a_number reads V3 as version 3: pull read it as an alias "v3"
    ref = parse_spec(f"{GLM}@V3")[1]
    assert ref.version == 3 and ref.alias is None and ref.label == "V3"
