"""The job runner in-process (calibrate/runner.py run()), on the session's test model."""

from __future__ import annotations

import pytest

from oscar_zoo.calibrate import loading, runner
from oscar_zoo.zoo.errors import InvalidInput

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_too_little_validation_text_fails_before_any_calibration_work(truncated_model, monkeypatch,
                                                                      tmp_path):
    # The runner loads the model itself; here it gets the session's (already loaded) one.
    monkeypatch.setattr(loading, "load_model", lambda src: truncated_model(2))
    (tmp_path / "tiny.txt").write_text("Only a few words of held-out text.")
    spec = {"model": "smollm2-135m", "tokens": 512, "seq_len": 512, "clip_search": False,
            "sink_tokens": 16, "recent_tokens": 32,
            "validation": {"data": [str(tmp_path / "tiny.txt")], "context_len": 128, "windows": 2}}
    events = []
    with pytest.raises(InvalidInput, match=r"tiny.txt has \d+ tokens.*validation.windows"):
        runner.run({"id": "job-1", "spec": spec}, tmp_path / "out",
                   lambda kind, **e: events.append(e), lambda: False)
    assert {e["phase"] for e in events} == {"loading"}      # no pass ran, nothing was lost
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field", ["data", "validation"])
def test_bad_data_fails_before_the_model_loads(monkeypatch, tmp_path, field):
    """The runner read the text only after loading the model: a GPU worker spent the load
    (minutes for a large model) on a job whose JSON lines had no text field."""
    def never(src):
        raise AssertionError("the model was loaded before the data was read")

    monkeypatch.setattr(loading, "load_model", never)
    (tmp_path / "rows.jsonl").write_text('{"body": "prose"}\n')
    bad = [str(tmp_path / "rows.jsonl")]
    spec = {"model": "smollm2-135m", **({"data": bad} if field == "data" else
                                        {"validation": {"data": bad}})}
    # the spec's field, which the job's owner sets, not the CLI's --text-field
    with pytest.raises(InvalidInput, match=r"rows.jsonl:1: no string field 'text' "
                                           r"\(set text_field in the job spec\)"):
        runner.run({"id": "job-1", "spec": spec}, tmp_path / "out", lambda kind, **e: None, lambda: False)
