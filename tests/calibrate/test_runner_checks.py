"""What the job runner (calibrate/runner.py run()) checks before it loads the model: the spec's
files, again on the worker's host (submit saw only where they are), and that it can name the
bundle. No model is loaded: one that would be fails the test."""

from __future__ import annotations

import os

import pytest

from oscar_zoo.calibrate import loading, runner
from oscar_zoo.zoo.errors import InvalidInput, ModelNotFound, OscarZooError


@pytest.fixture
def never_loaded(monkeypatch):
    def load(src):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", load)


def _run(spec: dict, tmp_path):
    return runner.run({"id": "job-1", "spec": spec}, tmp_path / "out", lambda kind, **e: None,
                      lambda: False)


def test_a_model_directory_whose_weights_vanished_fails_before_the_load(never_loaded, tmp_path):
    """A pruned Hugging Face cache leaves the snapshot's links to blobs that are gone: the
    directory and its config.json were there, so the runner went on to load the model, and
    failed deep inside it with an OSError, retried on every attempt."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    with pytest.raises(ModelNotFound, match=r"model path .*/model on worker host .*: "
                                            r"model.safetensors links to a file that no longer "
                                            r"exists \(restore it\); give a path every worker "
                                            r"can read") as e:
        _run({"model": str(model), "publish_as": "smollm2-135m"}, tmp_path)
    assert isinstance(e.value, OscarZooError)      # runner.main: not retried
    assert not (tmp_path / "out").exists()


def test_a_vanished_model_path_still_fails_with_its_message(never_loaded, tmp_path):
    with pytest.raises(ModelNotFound, match=r"model path .*/gone.gguf does not exist on worker "
                                            r"host .*; give a path every worker can read"):
        _run({"model": str(tmp_path / "gone.gguf"), "publish_as": "smollm2-135m"}, tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
@pytest.mark.parametrize("field", ["data", "validation"])
def test_an_unreadable_data_file_fails_before_the_load_and_is_not_retried(never_loaded, tmp_path,
                                                                          field):
    """It was a PermissionError from load_text: an OSError, retried on every attempt, with a
    traceback for its message."""
    text = tmp_path / "text.txt"
    text.write_text("some prose")
    text.chmod(0)
    entry = [str(text)]
    spec = {"model": "smollm2-135m", **({"data": entry} if field == "data" else
                                        {"validation": {"data": entry}})}
    with pytest.raises(InvalidInput, match=r"data file .*text.txt on worker host .*: .* is not "
                                           r"readable by the workers' user"):
        _run(spec, tmp_path)


def test_validation_data_of_a_job_without_validation_is_not_checked(monkeypatch, tmp_path):
    """The runner never reads it."""
    loaded = []

    def load(src):
        loaded.append(src)
        raise RuntimeError("loaded")

    monkeypatch.setattr(loading, "load_model", load)
    with pytest.raises(RuntimeError, match="loaded"):
        _run({"model": "smollm2-135m", "validation": {"enabled": False,
                                                       "data": [str(tmp_path / "gone.txt")]}},
             tmp_path)
    assert loaded


def test_a_publish_as_the_runner_cannot_stamp_fails_before_the_load(never_loaded, tmp_path):
    """A job queued before submit wrote an uploaded model's hub id into the spec (publish_as
    named by its registry name alone): stamp() refused it only after the calibration."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound, match="unknown model 'tiny-llama'"):
        _run({"model": str(tmp_path / "m.gguf"), "publish_as": "tiny-llama"}, tmp_path)
