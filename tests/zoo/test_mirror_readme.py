"""The mirror repo's landing page tells a visitor how to get a version, and what it says works:
the commands are run as written (values from its own table) against the loopback hub emulator."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from oscar_zoo.registry_db.mirrors import mirror_version
from tests.utils.bundles import make_bundle

from .test_mirror import REPO, registry  # noqa: F401 - the registry fixture


def test_the_root_readmes_commands_fetch_what_its_table_lists(registry, hub, tmp_path, monkeypatch):  # noqa: F811
    """It said `hf download REPO --include '<Model>/<tag>/*'`, which matches nothing (folders are
    seq<T>_prompt<N>_group<G>, tags are git refs), and `oscar-zoo pull <model>`, which reads
    only OSCAR's RotationZoo unless the mirror repo is named."""
    from huggingface_hub import HfApi, snapshot_download

    from oscar_zoo.zoo.pull import pull

    bundle = make_bundle(tmp_path / "b", seed=3)
    registry.publish_dir(bundle.path)
    assert [r.status for r in mirror_version(registry.registry, "smollm2-135m", 1, [f"hf:{REPO}"])] == ["done"]
    readme = Path(HfApi().hf_hub_download(REPO, "README.md", cache_dir=tmp_path / "hf")).read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| smollm2-135m |"))
    folder, tag = re.findall(r"`([^`]+)`", row)[:2]
    download = next(line for line in readme.splitlines() if line.startswith("hf download "))
    args = shlex.split(download.replace("<tag>", tag).replace("<folder>", folder)
                       .replace("<dir>", str(tmp_path / "got")))
    assert args[:3] == ["hf", "download", REPO]
    opts = dict(zip(args[3::2], args[4::2]))
    # the CLI's options, as huggingface_hub's own snapshot_download takes them
    snapshot_download(REPO, revision=opts["--revision"], allow_patterns=[opts["--include"]],
                      local_dir=opts["--local-dir"])
    got = sorted(p.name for p in (tmp_path / "got" / folder).iterdir())
    assert {"bundle.json", "rotations.safetensors"} <= set(got) and any(n.endswith(".pt") for n in got), got

    pull_line = next(line for line in readme.splitlines() if line.startswith("OSCAR_ZOO_HF_MIRROR_REPO="))
    var, _, rest = pull_line.partition(" ")
    assert rest == "oscar-zoo pull <model>"
    monkeypatch.setenv(*var.split("=", 1))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    assert pull("smollm2-135m").digest == bundle.digest
