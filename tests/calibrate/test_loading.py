"""Model and tokenizer loading (calibrate/loading.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oscar_zoo.calibrate import loading


@pytest.mark.model
def test_a_tokenizer_cache_write_cut_short_is_not_reused(monkeypatch):
    # The GGUF tokenizer is rebuilt once and cached; a save that dies half way (disk full, the
    # worker killed) must not leave a cache entry that every later job loads and chokes on.
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    src = loading.resolve_source("smollm2-135m")
    assert src.gguf_file is not None

    def dies_half_way(self, directory, *args, **kwargs):
        Path(directory).mkdir(parents=True, exist_ok=True)
        Path(directory, "tokenizer.json").write_text('{"version": "1.0", "truncat')
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(PreTrainedTokenizerBase, "save_pretrained", dies_half_way)
        with pytest.raises(OSError, match="No space"):
            loading.load_tokenizer(src)
    tok = loading.load_tokenizer(src)
    assert tok("The capital of France", add_special_tokens=False)["input_ids"]
    assert loading.load_tokenizer(src)("x")["input_ids"] == tok("x")["input_ids"]   # cached
