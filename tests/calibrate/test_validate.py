"""Held-out windows for validation (calibrate/validate.py), on the test model's tokenizer."""

from __future__ import annotations

import pytest

from oscar_zoo.calibrate.validate import BUILTIN, eval_windows

pytestmark = pytest.mark.model


class _NoBos:
    """The test model's tokenizer as a config that asks for a BOS token but defines none (a
    stand-in: no such tokenizer is available offline)."""
    add_bos_token = True
    bos_token_id = None

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **kwargs)


def test_windows_take_a_bos_only_where_the_tokenizer_has_one(smollm2):
    _, tok = smollm2
    _, plain = eval_windows(tok, [BUILTIN], "text", 64, 3)
    _, no_bos = eval_windows(_NoBos(tok), [BUILTIN], "text", 64, 3)
    assert [len(w) for w in no_bos] == [64] * 3 and all(isinstance(i, int) for w in no_bos for i in w)
    assert no_bos == plain      # the test model's own config adds no BOS either
