"""`list` says which version its validation column is of: the registry's verdict is the one of
the version a bare pull gets (recommended, else latest), and `LATEST 5  RECOMMENDED 2
VALIDATED yes` read as v5's when v5 had failed."""

from __future__ import annotations

import json

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.registry_client import RegistryClient

SMOL = "smollm2-135m"


def _row(stdout: str, name: str) -> tuple[str, str]:
    header, *lines = stdout.splitlines()
    line = next(ln for ln in lines if ln.startswith(f"{name} "))
    return header, line


def _failed_bundle(tmp_path):
    """A bundle whose report failed, by its numbers (the registry refuses a verdict they
    contradict): its extra loss far past Hadamard's."""
    from oscar_zoo.zoo.bundle import read, write
    from tests.api.ui.seeding import make_validated_bundle

    bundle = read(make_validated_bundle(tmp_path / "passed", seed=1).path)
    report = bundle.manifest.validation
    variants = [v.model_copy(update={"delta_nll": 1.0}) if v.name.startswith("bundle") else v
                for v in report.variants]
    bundle.manifest = bundle.manifest.model_copy(update={"validation": report.model_copy(
        update={"passed": False, "variants": variants})})
    return write(bundle, tmp_path / "failed")


def test_the_validation_column_names_the_version_it_is_of(registry, tmp_path):
    from tests.api.ui.seeding import make_validated_bundle

    registry.publish_dir(make_validated_bundle(tmp_path / "v1").path)                  # passed
    registry.publish_dir(_failed_bundle(tmp_path).path, status="published")   # asked for: latest
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.set_alias(SMOL, "recommended", 1)
    result = CliRunner().invoke(cli, ["list", "smollm2*"])
    assert result.exit_code == 0, result.output
    header, line = _row(result.stdout, SMOL)
    assert "VALIDATION" in header.split() and "VALIDATED" not in header.split()
    assert line.split()[2:5] == ["2", "1", "v1"] and " v1 passed " in line, line
    data = {r["name"]: r for r in json.loads(CliRunner().invoke(cli, ["list", "--json"]).stdout)}
    row = data[SMOL]     # the keys scripts read stay; the version they describe is added
    assert (row["latest"], row["recommended"], row["validated"], row["validated_version"]) \
        == (2, 1, True, 1)
    assert data["qwen3-8b"]["validated_version"] is None        # the catalog's: nothing known
    # without a recommended alias, the verdict is the latest's, and says so
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.remove_alias(SMOL, "recommended")
    _, line = _row(CliRunner().invoke(cli, ["list", "smollm2*"]).stdout, SMOL)
    assert " v2 FAILED " in line, line
