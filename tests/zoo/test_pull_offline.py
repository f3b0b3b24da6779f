"""What a pull asked for online is what the same pull finds offline (OSCAR_ZOO_OFFLINE or
HF_HUB_OFFLINE), or when no source can be reached: the cache records the ref asked for, as the
Hugging Face cache records refs/<revision>."""

from __future__ import annotations

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.pull import pull

GLM = "glm-4.7-fp8"


@pytest.mark.parametrize("alias", ["latest", "recommended"])
def test_an_alias_the_rotationzoo_answered_is_served_offline(seed_zoo, hub, monkeypatch, alias):
    """The RotationZoo answers @latest and @recommended with its one calibration but recorded
    only the ref `rotationzoo`: offline, the same command said the bundle was not cached."""
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    first = pull(f"{GLM}@{alias}", fmt="sglang")
    assert Cache().refs(GLM) == {alias: first.digest, "rotationzoo": first.digest}
    hub.log.clear()
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    again = pull(f"{GLM}@{alias}", fmt="sglang")
    assert again.digest == first.digest and again.export.files == first.export.files
    assert hub.log == []
    monkeypatch.delenv("OSCAR_ZOO_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens: unreachable
    down = pull(f"{GLM}@{alias}")
    assert down.digest == first.digest and "no source could be reached" in down.notes[0]
