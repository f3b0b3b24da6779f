"""Calibration text sources and token windows."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.calibrate.data import BUILTIN, load_text, token_windows
from oscar_zoo.calibrate.jobspec import DATA_TERMS
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
    with pytest.raises(InvalidInput, match=r"validation data .*blank.jsonl holds no text"):
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


# --- errors in the caller's words --------------------------------------------------------------
# The loader is shared by `oscar-zoo calibrate` / `validate` (options) and the job runner (a job
# spec's fields, sent over the REST API or by `oscar-zoo jobs submit`), for calibration text and
# validation's held-out text alike; each error names what that caller can change.

def _small(tmp_path, terms=None):
    (tmp_path / "small.txt").write_text("x" * 500)          # 5 windows of 100 characters
    kw = {} if terms is None else {"terms": terms}
    return load_text(str(tmp_path / "small.txt"), **kw)


def _refusal(call) -> str:
    with pytest.raises(InvalidInput) as e:
        call()
    return " ".join(str(e.value).split())


def test_too_little_text_names_the_cli_options_by_default(tmp_path):
    said = _refusal(lambda: token_windows(CharTokenizer(), _small(tmp_path), 100, 1000,
                                          held_out=2))
    assert said.endswith("small.txt has 500 tokens: room for 5 windows of 100, 10 needed for "
                         "1,000 tokens: --tokens 800 to calibrate on, plus 2 windows of --seq-len "
                         "100 held out for the clip search (--no-clip-search needs none). Lower "
                         "--tokens or --seq-len, or add data."), said
    plain = _refusal(lambda: token_windows(CharTokenizer(), _small(tmp_path), 100, 1000))
    assert plain.endswith("10 needed for 1,000 tokens. Lower --tokens or --seq-len, or add "
                          "data."), plain


def test_too_little_text_of_a_job_names_the_job_specs_fields(tmp_path):
    """The job runner reads its text with the spec's terms; the source carries them to
    token_windows, behind the pipeline that both the CLI and the runner call."""
    source = _small(tmp_path, DATA_TERMS)
    said = _refusal(lambda: token_windows(CharTokenizer(), source, 100, 1000, held_out=2))
    assert said.endswith("small.txt has 500 tokens: room for 5 windows of 100, 10 needed for "
                         "1,000 tokens: tokens 800 to calibrate on, plus 2 windows (clip_windows) "
                         "of seq_len 100 held out for the clip search (clip_search false needs "
                         "none). Lower tokens, clip_windows or seq_len in the job spec, or add "
                         "text to data."), said
    assert "--" not in said
    plain = _refusal(lambda: token_windows(CharTokenizer(), source, 100, 1000))
    assert plain.endswith("Lower tokens or seq_len in the job spec, or add text to data."), plain
    # told by the call, the source's terms give way
    told = _refusal(lambda: token_windows(CharTokenizer(), _small(tmp_path), 100, 1000,
                                          terms=DATA_TERMS))
    assert "Lower tokens or seq_len in the job spec" in told


def _files(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "c.gz").write_bytes(b"\x1f\x8b\0\0")
    (tmp_path / "body.jsonl").write_text('{"body": "x"}\n')
    return {name: str(tmp_path / name) for name in ("nope.txt", "empty.txt", "c.gz", "body.jsonl")}


@pytest.mark.parametrize("split, terms, text, setting, field", [
    ("calibration", None, "calibration data", "(--data)", "(set --text-field)"),
    ("heldout", None, "validation data", "(--data)", "(set --text-field)"),
    ("calibration", DATA_TERMS, "calibration data", "(data in the job spec)",
     "(set text_field in the job spec)"),
    ("heldout", DATA_TERMS, "validation data", "(validation.data in the job spec)",
     "(set text_field in the job spec)")])
def test_bad_data_is_named_as_its_caller_gives_it(tmp_path, split, terms, text, setting, field):
    """Validation's held-out text (`oscar-zoo validate --data`, a spec's validation.data) was
    called "calibration data", and a job's fields were named as CLI options."""
    files = _files(tmp_path)
    kw = {} if terms is None else {"terms": terms}
    read = lambda name: lambda: load_text([files[name]], split, **kw)  # noqa: E731
    said = _refusal(read("nope.txt"))
    assert said.startswith(f"{text} '{files['nope.txt']}': no such file") and said.endswith(setting)
    said = _refusal(read("empty.txt"))
    assert said.startswith(f"{text} {files['empty.txt']} holds no text") and said.endswith(setting)
    said = _refusal(read("c.gz"))
    assert said.startswith(f"{text} '{files['c.gz']}' is a binary file") and said.endswith(setting)
    said = _refusal(read("body.jsonl"))
    assert said == f"{files['body.jsonl']}:1: no string field 'text' {field}"
    other = "validation" if text.startswith("calibration") else "calibration"
    assert other not in _refusal(read("nope.txt")).replace(files["nope.txt"], "")
