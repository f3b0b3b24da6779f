"""Property-based run of every operation in /openapi.json against the real server: whatever
schemathesis sends (with an admin token, so writes are reached too), the answer is never a 5xx.

Kept short for CI (SCHEMATHESIS_MAX_EXAMPLES, default 12 per operation and backend).
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from tests.utils.bundles import make_bundle

# Half the cases aim at things that exist, so query strings and bodies meet real rows.
REAL = st.one_of(st.none(), st.fixed_dictionaries({
    "name": st.sampled_from(["smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"]),
    "ref": st.sampled_from(["1", "latest", "recommended"]),
    "filename": st.sampled_from(["bundle.json", "rotations.safetensors", "README.md"]),
    "layer": st.integers(0, 31), "alias": st.sampled_from(["recommended", "latest", "prod"]),
}))


def aim(case, real) -> None:
    if isinstance(case.body, dict) and "wait" in case.body:
        case.body["wait"] = 0  # the workers' claim long-polls up to 30 s: never wait here
    for key, value in (real or {}).items():
        if case.path_parameters and key in case.path_parameters:
            case.path_parameters[key] = value

MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "12"))


def test_no_server_errors(registry_server, tmp_path):
    make_bundle(tmp_path / "b", per_head=True)       # one published version, so paths resolve
    registry_server.publish_dir(tmp_path / "b")
    token = registry_server.token("admin", name="schemathesis")
    schema = schemathesis.openapi.from_url(f"{registry_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15

    # The pytest plugin of schemathesis does not run under pytest 9; drive hypothesis directly.
    for operation in operations:
        @given(case=operation.as_strategy(), real=REAL)
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case, real):
            aim(case, real)
            case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                                   checks=[not_a_server_error])

        try:
            check()
        except Exception as e:
            raise AssertionError(f"{operation.label}: {e}") from e
