"""A job for a model the registry knows only from an upload (not in the catalog, not named by a
hub id), on SQLite and PostgreSQL: submit passed it, and the runner, which has no registry,
could not stamp the bundle (jobspec.identity) until after the whole calibration. Submit now
writes the model into the stored spec as the workers need it. No model is loaded: the runner's
stamp() is called on the stored spec, and the bundle is one of tests/utils/bundles.py."""

from __future__ import annotations

import pytest

from oscar_zoo.calibrate import jobspec, runner
from oscar_zoo.zoo.bundle import Bundle, write
from oscar_zoo.zoo.errors import InvalidInput, ModelNotFound
from oscar_zoo.zoo.geometry import ModelGeometry
from oscar_zoo.zoo.manifest import Geometry, ModelRef
from tests.utils.bundles import make_manifest, make_tensors

NAME, HUB_ID = "tiny-llama", "someone/Tiny-Llama"


def _manifest():
    return make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name=NAME, hub_id=HUB_ID, architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 64))})


@pytest.fixture
def uploaded(jobs_api, tmp_path):
    """The registry holds tiny-llama (someone/Tiny-Llama) from an upload, as version 1."""
    manifest = _manifest()
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / "uploaded")
    jobs_api.server.registry.publish(tmp_path / "uploaded", created_by="test")
    return jobs_api


def _runner_bundle(job: dict, out) -> None:
    """What the runner writes for the stored job: a bundle stamped by runner.stamp() alone."""
    manifest = _manifest().model_copy(update={
        "model": ModelRef(name="whatever-the-pipeline-saw", hub_id="x/y", architecture="Llama")})
    stamped = runner.stamp(manifest, job, jobspec.parse_spec(job["spec"]))
    write(Bundle(stamped, *make_tensors(stamped, seed=1)), out)


def test_publish_as_an_uploaded_model_is_stamped_by_the_runner_and_published_there(uploaded,
                                                                                    tmp_path):
    # a lease that outlasts writing the bundle on a loaded machine (jobs_api's default is 3 s,
    # and one CI run lost it between claim and upload)
    job, created = uploaded.submitter.submit({"model": str(tmp_path / "tiny.gguf"),
                                              "publish_as": "Tiny-Llama", "lease_seconds": 60})
    assert created and job["model"] == NAME
    # the registry's names for it, in the spec the worker gets: it has no registry to ask
    assert job["spec"]["publish_as"] == NAME and job["spec"]["publish_hub_id"] == HUB_ID
    assert jobspec.identity(jobspec.parse_spec(job["spec"])) == (NAME, HUB_ID, None)

    claimed = uploaded.worker.claim("w1", 0)
    _runner_bundle(claimed["job"], tmp_path / "result")
    version, created = uploaded.worker.upload_result(job["id"], claimed["lease"]["token"],
                                                     tmp_path / "result", "published")
    assert created and version["model"] == NAME and version["version"] == 2
    assert version["manifest"]["model"]["name"] == NAME
    assert version["manifest"]["model"]["hub_id"] == HUB_ID


def test_an_uploaded_model_as_model_is_loaded_from_its_hub_id_and_published_under_its_name(
        uploaded, tmp_path):
    """The runner could load no such name either (loading.resolve_source)."""
    job, _ = uploaded.submitter.submit({"model": NAME, "tokens": 4096}, idempotency_key="k")
    spec = job["spec"]
    assert job["model"] == NAME
    assert (spec["model"], spec["publish_as"], spec["publish_hub_id"]) == (HUB_ID, NAME, HUB_ID)
    assert jobspec.identity(jobspec.parse_spec(spec)) == (NAME, HUB_ID, None)
    # a retry with its key is the same request, though the stored spec spells the model out
    again, created = uploaded.submitter.submit({"model": NAME, "tokens": 4096},
                                               idempotency_key="k")
    assert not created and again["id"] == job["id"]


def test_publish_hub_id_is_the_registrys_not_the_callers(uploaded, tmp_path):
    path = str(tmp_path / "tiny.gguf")
    with pytest.raises(InvalidInput, match="knows 'tiny-llama' as someone/Tiny-Llama; leave "
                                           "publish_hub_id out"):
        uploaded.submitter.submit({"model": path, "publish_as": NAME,
                                   "publish_hub_id": "other/Tiny-Llama"})
    with pytest.raises(InvalidInput, match="only for a publish_as that names a model this "
                                           "registry holds"):
        uploaded.submitter.submit({"model": "smollm2-135m", "publish_hub_id": HUB_ID})
    # it cannot make up a model the registry does not hold
    with pytest.raises(ModelNotFound, match="unknown model 'made-up'"):
        uploaded.submitter.submit({"model": path, "publish_as": "made-up",
                                   "publish_hub_id": "someone/made-up"})
    # a spec as it was stored (e.g. from a bundle's calibration.spec) is taken again
    job, created = uploaded.submitter.submit({"model": path, "publish_as": NAME,
                                              "publish_hub_id": HUB_ID.lower()})
    assert created and job["spec"]["publish_hub_id"] == HUB_ID


def test_an_unknown_model_is_still_refused_with_suggestions(uploaded):
    with pytest.raises(ModelNotFound, match="unknown model 'tiny-lama'") as e:
        uploaded.submitter.submit({"model": "tiny-lama"})
    assert NAME in (e.value.suggestions or [])
