"""The mirror repo's landing page tells a visitor how to get a version, in the tools of the hub
it is on, and what it says works: the commands are run as written (values from its own table)
against the loopback hub emulator, with the hubs' own CLIs and oscar-zoo."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from oscar_zoo.registry_db.mirrors import mirror_version
from oscar_zoo.zoo.mirror import layout
from tests.utils.bundles import make_bundle

from .test_mirror import (BUNDLE_FILES, FOLDER, HF, MS, PT_FILES, REPO,  # noqa: F401
                          bundles, registry, same_calibration_as)

MODEL = "smollm2-135m"


def readme_of(hub, kind: str) -> str:
    return hub.repo(kind, REPO).files()["README.md"][0].decode()


def row_of(readme: str, version: int) -> tuple[str, str]:
    """(folder, tag) in the table row of `version`."""
    row = next(line for line in readme.splitlines()
               if re.match(rf"\| {MODEL} \| {version}( |$)", line))
    folder, tag = re.findall(r"`([^`]+)`", row)[:2]
    return folder, tag


def command(readme: str, starts: str, folder: str, tag: str, out: Path) -> list[str]:
    line = next(x for x in readme.splitlines() if x.startswith(starts))
    return shlex.split(line.replace("<tag>", tag).replace("<folder>", folder)
                       .replace("<dir>", str(out)))


def run_hf(args: list[str]) -> None:
    """The `hf` CLI, in this process (so under the test's socket guard)."""
    from huggingface_hub.cli.hf import app

    assert args[0] == "hf"
    app(args[1:], standalone_mode=False)


def run_modelscope(args: list[str]) -> None:
    """The `modelscope` CLI (modelscope-hub's), in this process."""
    from modelscope_hub.cli.main import run_cmd

    assert args[0] == "modelscope"
    assert run_cmd(args[1:]) == 0


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and ".cache" not in p.parts}


def test_the_root_readmes_commands_fetch_what_its_table_lists(registry, hub, tmp_path, monkeypatch):  # noqa: F811
    """It said `hf download REPO --include '<Model>/<tag>/*'`, which matches nothing (folders are
    seq<T>_prompt<N>_group<G>, tags are git refs), and `oscar-zoo pull <model>`, which reads
    only OSCAR's RotationZoo unless the mirror repo is named."""
    from oscar_zoo.zoo.pull import pull

    bundle = make_bundle(tmp_path / "b", seed=3)
    registry.publish_dir(bundle.path)
    assert [r.status for r in mirror_version(registry.registry, MODEL, 1, [HF])] == ["done"]
    readme = readme_of(hub, "hf")
    folder, tag = row_of(readme, 1)
    args = command(readme, "hf download ", folder, tag, tmp_path / "got")
    assert args[:3] == ["hf", "download", REPO]
    run_hf(args)
    got = sorted(p.name for p in (tmp_path / "got" / folder).iterdir())
    assert {"bundle.json", "rotations.safetensors"} <= set(got) and any(n.endswith(".pt") for n in got), got

    pull_line = next(line for line in readme.splitlines() if line.startswith("OSCAR_ZOO_HF_MIRROR_REPO="))
    var, _, rest = pull_line.partition(" ")
    assert rest == "oscar-zoo pull <model>"
    monkeypatch.setenv(*var.split("=", 1))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    assert pull(MODEL).digest == bundle.digest


def test_a_modelscope_mirrors_landing_page_speaks_modelscope(registry, hub, tmp_path, monkeypatch):  # noqa: F811
    """The README written to a ModelScope repo showed `hf download` and the Hugging Face pull
    line: useless to a visitor of ModelScope, who may not reach the Hub at all."""
    from oscar_zoo.zoo.pull import pull

    bundle = make_bundle(tmp_path / "b", seed=3)
    registry.publish_dir(bundle.path)
    assert [r.status for r in mirror_version(registry.registry, MODEL, 1, [HF, MS])] == ["done"] * 2
    on_hf, on_ms = readme_of(hub, "hf"), readme_of(hub, "ms")
    assert "modelscope" not in on_hf.lower()
    for said in ("hf download", "OSCAR_ZOO_HF_MIRROR_REPO", "Hugging Face"):
        assert said not in on_ms, said
    assert f"modelscope download --model {REPO} --revision <tag> " in on_ms

    folder, tag = row_of(on_ms, 1)
    run_modelscope(command(on_ms, "modelscope download ", folder, tag, tmp_path / "got"))
    assert files_under(tmp_path / "got") == {f"{folder}/{n}" for n in BUNDLE_FILES + PT_FILES}

    line = next(x for x in on_ms.splitlines() if x.startswith("OSCAR_ZOO_MODELSCOPE_MIRROR_REPO="))
    var, _, rest = line.partition(" ")
    assert rest == "oscar-zoo pull <model>"
    monkeypatch.setenv(*var.split("=", 1))       # the sources as they are (hf, then modelscope)
    got = pull(MODEL)
    assert (got.source, got.digest) == ("modelscope", bundle.digest)


@pytest.fixture
def three_in_one_folder(registry, bundles, hub, tmp_path):  # noqa: F811
    """v2, then v1 (into a v1/ subfolder: main keeps the newer), then v3 (main's folder again,
    its tag holding v1/ beneath it), all of one calibration, on both hubs."""
    versions = {1: bundles[0], 2: same_calibration_as(bundles[0], tmp_path / "v2", seed=7),
                3: same_calibration_as(bundles[0], tmp_path / "v3", seed=8)}
    for n in (1, 2, 3):
        registry.publish_dir(versions[n].path)
    for n in (2, 1, 3):
        assert [r.status for r in mirror_version(registry.registry, MODEL, n, [HF, MS])] == ["done"] * 2
    return versions


def test_the_documented_patterns_select_exactly_one_versions_files(three_in_one_folder, hub):
    """`--include '<folder>/*'` alone, as huggingface_hub matches it (fnmatch: `*` crosses `/`),
    also took the older versions kept in v<N>/ subfolders of the folder: v3's download held
    v1's files too, and a reader could not tell which bundle.json was v3's."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    readme = readme_of(hub, "hf")
    index = json.loads(hub.repo("hf", REPO).files()["oscar-zoo.json"][0])
    for n in (1, 2, 3):
        folder, tag = row_of(readme, n)
        assert folder == (f"{FOLDER}/v1" if n == 1 else FOLDER)
        opts = command(readme, "hf download ", folder, tag, Path("d"))
        include, exclude = opts[opts.index("--include") + 1], opts[opts.index("--exclude") + 1]
        at_tag = HfApi().list_repo_files(REPO, revision=tag)
        chosen = set(filter_repo_objects(at_tag, allow_patterns=[include], ignore_patterns=[exclude]))
        entry = index["models"][MODEL]["versions"][str(n)]
        assert chosen == {f"{folder}/{name}" for name in entry["files"]}, n
    assert any(p.startswith(f"{FOLDER}/v1/") for p in HfApi().list_repo_files(REPO, revision=row_of(readme, 3)[1]))


def test_modelscopes_cli_takes_the_same_patterns_alike(three_in_one_folder, hub, tmp_path):
    """The nested case through modelscope-hub's own matcher: v3's folder, whose tag holds v1/."""
    readme = readme_of(hub, "ms")
    folder, tag = row_of(readme, 3)
    run_modelscope(command(readme, "modelscope download ", folder, tag, tmp_path / "got"))
    assert files_under(tmp_path / "got") == {f"{folder}/{n}" for n in BUNDLE_FILES + PT_FILES}


@pytest.mark.parametrize("folder, wanted", [
    ("M/seq8_prompt1_group64", {"M/seq8_prompt1_group64/bundle.json",
                                "M/seq8_prompt1_group64/v_rotation_sst_r_h_pbr.pt"}),
    ("M/seq8_prompt1_group64/v1", {"M/seq8_prompt1_group64/v1/bundle.json"}),
])
def test_the_patterns_leave_out_subfolders_and_look_alike_names(folder, wanted):
    from huggingface_hub.utils import filter_repo_objects

    paths = ["M/seq8_prompt1_group64/bundle.json", "M/seq8_prompt1_group64/v_rotation_sst_r_h_pbr.pt",
             "M/seq8_prompt1_group64/v1/bundle.json", "M/seq8_prompt1_group64/v10/bundle.json",
             "M/seq8_prompt1_group64/v1/v2/bundle.json", "X/M/seq8_prompt1_group64/bundle.json",
             "M/seq8_prompt1_group640/bundle.json"]
    args = shlex.split(layout.version_patterns(folder))
    chosen = set(filter_repo_objects(paths, allow_patterns=[args[1]], ignore_patterns=[args[3]]))
    assert chosen == wanted
