"""A pull with ModelScope unreachable: modelscope-hub's own timestamped log lines ("WARNING |
modelscope_hub.legacy_api | ... retry in 1s (1/4)") stay off stderr, the unreachable host fails
within our few quick retries (as the HF source does) instead of the library's 1 + 2 + 4 s, and
the final error says what the cache holds once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from oscar_zoo.zoo.errors import OfflineError
from oscar_zoo.zoo.pull import pull

GLM = "glm-4.7-fp8"
DEAD = "http://127.0.0.1:1"     # nothing listens: connection refused


def test_an_unreachable_modelscope_fails_fast_and_quietly(sandbox):
    """In a child process with modelscope-hub's retries as users have them (conftest cuts them
    for this test process)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MODELSCOPE_") or k in ("MODELSCOPE_CACHE", "MODELSCOPE_HOME")}
    env.update(MODELSCOPE_ENDPOINT=DEAD, OSCAR_ZOO_SOURCES="modelscope")
    env.pop("OSCAR_ZOO_ENDPOINT", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "pull", GLM], env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert "modelscope_hub" not in proc.stderr and "retry in" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr      # one line: ours
    assert f"modelscope:togethercomputer/OSCAR-RotationZoo@master: cannot reach {DEAD} " \
           "(ConnectError); check your network" in proc.stderr
    assert took < 6, f"{took:.1f} s: the library's own retries (7 s) ran"


def test_the_library_log_is_left_as_asked_with_modelscope_log_level(monkeypatch):
    """MODELSCOPE_LOG_LEVEL set by the user: their choice, not hushed."""
    import logging

    from oscar_zoo.zoo.sources.hubs import _client_log_hushed
    from modelscope_hub.utils.logger import get_logger

    logger = get_logger()
    before = logger.level
    with _client_log_hushed():
        assert logger.level == logging.ERROR
    assert logger.level == before
    monkeypatch.setenv("MODELSCOPE_LOG_LEVEL", "DEBUG")
    with _client_log_hushed():
        assert logger.level == before


def test_the_error_says_what_the_cache_holds_once(hub, monkeypatch):
    """It read "...; and no source could serve it, and glm-4.7-fp8 is not in the cache (...);
    glm-4.7-fp8 is not cached at all. To fix: pull it once (oscar-zoo pull glm-4.7-fp8)": the
    same thing twice, and for a fix the command that had just failed."""
    monkeypatch.setenv("HF_ENDPOINT", DEAD)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", DEAD)
    with pytest.raises(OfflineError) as e:
        pull(GLM)
    said = str(e.value)
    assert said.endswith(f"; and {GLM} is not cached at all ({os.environ['OSCAR_ZOO_CACHE']})")
    assert "no source could serve it" not in said and "is not in the cache" not in said
    assert "pull it once" not in said and said.count("check your network") == 2
