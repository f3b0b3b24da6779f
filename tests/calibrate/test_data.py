"""Calibration text sources and token windows."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.calibrate.data import BUILTIN, load_text, token_windows
from oscar_zoo.zoo.errors import InvalidInput


class CharTokenizer:
    """One token per character: enough to test windowing without a model."""

    bos_token_id = 0
    add_bos_token = False

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 1000 + 1 for c in text]}


def test_builtin_corpus_splits_are_disjoint_halves():
    calib, held = load_text(BUILTIN, "calibration"), load_text(BUILTIN, "heldout")
    assert len(calib.text) > 200_000 and len(held.text) > 200_000
    assert calib.text[-2000:] not in held.text
    assert calib.sha256 != held.sha256 and calib.name.endswith("#calibration")


def test_windows_budget_and_seed():
    src = load_text(BUILTIN)
    tok = CharTokenizer()
    w = token_windows(tok, src, seq_len=100, budget=950, seed=1)
    assert len(w) == 10 and all(len(x) == 100 for x in w)
    assert w == token_windows(tok, src, 100, 950, seed=1)
    assert w != token_windows(tok, src, 100, 950, seed=2)
    starts = [src.text.find("".join(chr(c - 1) for c in x[:20])) for x in w]
    assert len(set(starts)) == 10                       # no window repeats another


def test_bos_is_prepended_when_the_tokenizer_adds_one():
    tok = CharTokenizer()
    tok.add_bos_token = True
    w = token_windows(tok, load_text(BUILTIN), seq_len=64, budget=64)
    assert w[0][0] == 0 and len(w[0]) == 64


def test_jsonl_and_text_files(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "alpha"}) + "\n\n" + json.dumps({"text": "beta"}))
    (tmp_path / "b.txt").write_text("gamma")
    src = load_text([str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")])
    assert src.text == "alpha\n\nbeta\n\ngamma"
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(InvalidInput, match="bad.jsonl:1.*--text-field"):
        load_text(str(tmp_path / "bad.jsonl"))


def test_clear_errors_for_missing_data_and_too_small_corpora(tmp_path):
    with pytest.raises(InvalidInput, match="no such file"):
        load_text(str(tmp_path / "nope.txt"))
    (tmp_path / "small.txt").write_text("x" * 500)
    with pytest.raises(InvalidInput, match="Lower --tokens"):
        token_windows(CharTokenizer(), load_text(str(tmp_path / "small.txt")), 100, 1000)


def test_binary_and_non_utf8_data_files_are_refused_with_the_file_named(tmp_path):
    import gzip

    rows = "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(200)).encode()
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(rows))
    with pytest.raises(InvalidInput, match="c.jsonl.gz.*binary.*uncompressed"):
        load_text(str(tmp_path / "c.jsonl.gz"))
    (tmp_path / "latin1.jsonl").write_bytes(rows[:40] + '{"text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(InvalidInput, match=r"latin1.jsonl:3: not UTF-8"):
        load_text(str(tmp_path / "latin1.jsonl"))
    (tmp_path / "crlf.txt").write_bytes(b"a\r\nb\rc\xff")      # text as before: newlines, U+FFFD
    assert load_text(str(tmp_path / "crlf.txt")).text == "a\nb\nc\ufffd"


def test_an_empty_source_is_named_even_beside_others(tmp_path):
    """An empty file among several added nothing, silently; alone it was reported as
    "calibration data ['...'] is empty" when it was validation's held-out text."""
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": " "}\n')
    (tmp_path / "prose.txt").write_text("some prose")
    with pytest.raises(InvalidInput, match=r"calibration data .*empty.txt holds no text"):
        load_text([str(tmp_path / "prose.txt"), str(tmp_path / "empty.txt")])
    with pytest.raises(InvalidInput, match=r"held-out data .*blank.jsonl holds no text"):
        load_text([str(tmp_path / "blank.jsonl")], "heldout")


def test_jsonl_with_a_byte_order_mark_reads(tmp_path):
    # Windows tools write one; json.loads refused line 1 ("Unexpected UTF-8 BOM")
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "alpha"}\n{"text": "beta"}\n')
    assert load_text(str(tmp_path / "bom.jsonl")).text == "alpha\n\nbeta"


def test_a_missing_hf_dataset_is_bad_input_not_a_retryable_io_error(monkeypatch):
    """`datasets` raises DatasetNotFoundError, a FileNotFoundError, which the job runner retried
    as an I/O error. `datasets` is not installed here (and would need the network), so a stand-in
    module with the same exception is put in its place: that is the only mock in this file."""
    import sys
    import types

    class DatasetNotFoundError(FileNotFoundError):
        pass

    def load_dataset(*args, **kwargs):
        raise DatasetNotFoundError("Dataset 'org/nope' doesn't exist on the Hub")

    fake = types.ModuleType("datasets")
    fake.exceptions = types.SimpleNamespace(DatasetNotFoundError=DatasetNotFoundError)
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(InvalidInput, match="hf:org/nope.*doesn't exist.*HF_TOKEN"):
        load_text(["hf:org/nope"])
