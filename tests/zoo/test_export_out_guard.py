"""`export --out DIR` and `pull --out DIR` do not replace a file oscar-zoo did not write there:
a RotationZoo checkout holds OSCAR's very names (k_rotation_qqt_r_h_pbr.pt), and the user's own
copy was replaced without a word. What an earlier export wrote (DIR/.oscar-zoo.json lists it,
with its sha256) may be replaced; nothing is written when something is in the way."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.bundles import make_bundle

K, V = "k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt"


def _tree(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture
def bundles(tmp_path):
    return [make_bundle(tmp_path / f"b{i}", model="qwen3-8b", seed=i) for i in (0, 1)]


def test_the_users_own_file_of_the_same_name_is_not_replaced(tmp_path, bundles):
    out = tmp_path / "checkout"
    out.mkdir()
    (out / K).write_bytes(b"the user's own rotation, from a RotationZoo checkout")
    before = _tree(out)
    r = CliRunner().invoke(cli, ["export", str(bundles[0].path), "--out", str(out)])
    assert r.exit_code == 1, r.output
    assert f"--out {out} already holds {K}, which oscar-zoo did not write there" in r.stderr
    assert "nothing was written" in r.stderr and "choose another --out" in r.stderr
    assert _tree(out) == before          # no V, no marker, no temp file: nothing half-written
    (out / K).unlink()                   # the fix the message gives
    assert CliRunner().invoke(cli, ["export", str(bundles[0].path), "--out", str(out)]).exit_code == 0


def test_an_earlier_export_into_the_same_dir_is_replaced(tmp_path, bundles):
    out = tmp_path / "rotations"
    run = CliRunner().invoke
    assert run(cli, ["export", str(bundles[0].path), "--out", str(out)]).exit_code == 0
    r = run(cli, ["export", str(bundles[1].path), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    mark = json.loads((out / ".oscar-zoo.json").read_text())
    assert mark["digest"] == bundles[1].digest and sorted(mark["files"]) == [K, V]
    # and the same export again, over its own files, with the marker gone: same bytes, no loss
    (out / ".oscar-zoo.json").unlink()
    assert run(cli, ["export", str(bundles[1].path), "--out", str(out)]).exit_code == 0


def test_a_file_of_ours_edited_since_is_not_replaced(tmp_path, bundles):
    out = tmp_path / "rotations"
    run = CliRunner().invoke
    assert run(cli, ["export", str(bundles[0].path), "--out", str(out)]).exit_code == 0
    (out / V).write_bytes(b"edited by hand")
    before = _tree(out)
    r = run(cli, ["export", str(bundles[1].path), "--out", str(out)])
    assert r.exit_code == 1, r.output
    assert f"already holds {V} (changed since oscar-zoo wrote it)" in r.stderr
    assert K not in r.stderr.split("already holds")[1].split(", which")[0]   # K is ours, unchanged
    assert _tree(out) == before


def test_pull_out_refuses_too(hf_only, tmp_path):
    """pull --out goes through the same export: the bundle is cached, the user's files stay."""
    from oscar_zoo.zoo.errors import Conflict
    from oscar_zoo.zoo.pull import pull

    from .conftest import GLM_FILES

    out = tmp_path / "zoo-checkout"
    out.mkdir()
    for name in GLM_FILES:
        (out / name).write_bytes(b"mine")
    with pytest.raises(Conflict, match=f"already holds {GLM_FILES[0]}, {GLM_FILES[1]}, which"):
        pull("glm-4.7-fp8", fmt="sglang", out=out)
    assert _tree(out) == {name: b"mine" for name in sorted(GLM_FILES)}
    assert pull("glm-4.7-fp8", fmt="sglang").cached       # the pull itself was kept
