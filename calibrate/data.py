"""Calibration and evaluation text: where it comes from and how it is cut into token windows.

Sources (`--data`):
    builtin:pydoc           CPython's pydoc topics (465k characters of English reference prose);
                            ships with every Python, so it works offline. Its first half is the
                            calibration split, its second half the held-out split.
    path/to/file.txt        plain text (several files: repeat --data)
    path/to/file.jsonl      one JSON object per line, text in the "text" field (--text-field)
    hf:ORG/NAME[:CONFIG][@SPLIT]  a Hugging Face dataset (needs `datasets`, and the network
                            unless it is cached)
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from oscar_zoo.zoo.errors import InvalidInput

BUILTIN = "builtin:pydoc"


@dataclass(frozen=True)
class Terms:
    """What a caller calls the settings its text is read and cut with, for errors to name what
    that caller can change (as jobspec.check_clip_windows is told its caller's names).
    CLI: `oscar-zoo calibrate` / `validate`; a job spec's are jobspec.DATA_TERMS."""

    data: str = "--data"                      # the calibration sources
    held_out_data: str = "--data"             # validation's (`oscar-zoo validate --data`)
    text_field: str = "--text-field"
    tokens: str = "--tokens"
    seq_len: str = "--seq-len"
    clip_windows: str | None = None           # None: a fixed count, no setting of the caller's
    no_clip_search: str = "--no-clip-search"
    where: str = ""                           # after a setting's name: " in the job spec"
    more_text: str = "add data"


CLI = Terms()


@dataclass(frozen=True)
class TextSource:
    name: str          # how the manifest records it
    text: str
    sha256: str
    # how its reader names its settings: token_windows' error for too little text is raised
    # behind the pipeline, which both the CLI and the job runner hand this source to
    terms: Terms = field(default=CLI, compare=False, repr=False)


def load_text(specs: list[str] | str | None, split: str = "calibration",
              text_field: str = "text", *, terms: Terms = CLI) -> TextSource:
    """One text from one or more sources. `split` picks a half of the built-in corpus, and
    whether the errors speak of calibration or validation text; `terms` names the caller's
    settings in them (and in token_windows' of the source): the CLI's options unless told."""
    specs = [specs] if isinstance(specs, str) else list(specs or [BUILTIN])
    parts = [_one(spec, split, text_field, terms) for spec in specs]
    # each source by name: one empty file among several would otherwise add nothing, silently
    empty = [spec for spec, part in zip(specs, parts) if not part.strip()]
    if empty:
        raise InvalidInput(f"{_what(split, ', '.join(empty))} holds no text (an empty file, or "
                           "JSON lines whose text fields are all empty): give a file with text "
                           f"in it ({_setting(split, terms)})")
    text = "\n\n".join(parts)
    name = ",".join(specs) + (f"#{split}" if BUILTIN in specs else "")
    return TextSource(name, text, hashlib.sha256(text.encode()).hexdigest(), terms)


def _what(split: str, specs: str) -> str:
    # validation's held-out text was called "calibration data"
    return f"{'validation' if split == 'heldout' else 'calibration'} data {specs}"


def _setting(split: str, terms: Terms) -> str:
    """Where the caller gives that text: an option, or a job spec's field."""
    return (terms.held_out_data if split == "heldout" else terms.data) + terms.where


def _one(spec: str, split: str, text_field: str, terms: Terms) -> str:
    if spec == BUILTIN:
        return _pydoc(split)
    if spec.startswith("hf:"):
        return _hf_dataset(spec[3:], text_field, terms)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InvalidInput(f"{_what(split, repr(spec))}: no such file. Use a .txt or .jsonl path, "
                           f"{BUILTIN}, or hf:ORG/NAME ({_setting(split, terms)})")
    raw = path.read_bytes()
    if b"\0" in raw:      # text never holds NUL; read as text, a .gz or .parquet would be noise
        raise InvalidInput(f"{_what(split, repr(spec))} is a binary file, not text: give plain "
                           "text (.txt) or JSON lines (.jsonl), uncompressed "
                           f"({_setting(split, terms)})")
    if path.suffix == ".jsonl":
        return _jsonl(path, raw, text_field, terms)
    return raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _pydoc(split: str) -> str:
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    half = len(text) // 2
    if split == "calibration":
        return text[:half]
    if split == "heldout":
        return text[half:]
    raise InvalidInput(f"unknown split {split!r} (calibration or heldout)")


def _jsonl(path: Path, raw: bytes, field: str, terms: Terms) -> str:
    try:
        text = raw.decode("utf-8-sig")   # a BOM (Windows tools write one) is no JSON
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InvalidInput(f"{path}:{line}: not UTF-8 (JSON lines must be UTF-8 text)") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidInput(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise InvalidInput(f"{path}:{n}: no string field {field!r} "
                               f"(set {terms.text_field}{terms.where})")
        out.append(row[field])
    return "\n\n".join(out)


def _hf_dataset(ref: str, field: str, terms: Terms) -> str:
    try:
        import datasets
    except ImportError:
        raise InvalidInput("hf: datasets need the `datasets` package: pip install datasets") from None
    ref, _, split = ref.partition("@")
    name, _, config = ref.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split=split or "train")
    except getattr(getattr(datasets, "exceptions", None), "DatasetNotFoundError", ()) as e:
        # a FileNotFoundError, which a job would otherwise retry as an I/O error
        raise InvalidInput(f"hf:{ref}: {e} (check the name, or set HF_TOKEN for a gated "
                           "dataset)") from None
    if field not in ds.column_names:
        raise InvalidInput(f"dataset {name} has no column {field!r}; columns: {ds.column_names} "
                           f"(set {terms.text_field}{terms.where})")
    return "\n\n".join(t for t in ds[field] if t)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer starts text with a BOS token by itself (and has one to add)."""
    return bool(getattr(tokenizer, "add_bos_token", False)) and tokenizer.bos_token_id is not None


def whole_windows(tokens: int, seq_len: int) -> int:
    """How many windows a budget of `tokens` takes: whole ones, the last one full."""
    return -(-tokens // seq_len)


def token_windows(tokenizer, source: TextSource, seq_len: int, budget: int, seed: int = 0,
                  bos: bool | None = None, held_out: int = 0,
                  terms: Terms | None = None) -> list[list[int]]:
    """ceil(budget / seq_len) non-overlapping windows of seq_len tokens, chosen with `seed`;
    `held_out` of them are the clip search's, which the error for too little text names (a user
    who asked for --tokens alone could not tell "3 needed for 1,536 tokens" from --tokens 512).
    That error names the settings as `terms` (default: the source's, its reader's) call them.

    A BOS token is prepended when the tokenizer adds one by itself (Gemma) so every window
    starts the way the model saw text in training.
    """
    ids = tokenizer(source.text, add_special_tokens=False)["input_ids"]
    if bos is None:
        bos = adds_bos(tokenizer)
    body = seq_len - int(bos)
    n = whole_windows(budget, seq_len)
    slots = len(ids) // body
    if slots < n:
        raise InvalidInput(f"{source.name} has {len(ids):,} tokens: room for {slots} windows of "
                           f"{seq_len}, {n} needed for {budget:,} tokens"
                           f"{_too_little(terms or source.terms, budget, seq_len, held_out)}")
    chosen = sorted(random.Random(seed).sample(range(slots), n))
    prefix = [tokenizer.bos_token_id] if bos else []
    return [prefix + ids[s * body:(s + 1) * body] for s in chosen]


def _too_little(t: Terms, budget: int, seq_len: int, held_out: int) -> str:
    """The rest of the too-little-text error: where the windows go, and what to lower."""
    why = ""
    if held_out:
        held = f"{held_out} window{'s' if held_out != 1 else ''}"
        if t.clip_windows:
            held += f" ({t.clip_windows})"
        why = (f": {t.tokens} {budget - held_out * seq_len:,} to calibrate on, plus {held} of "
               f"{t.seq_len} {seq_len:,} held out for the clip search ({t.no_clip_search} needs "
               "none)")
    lower = [t.tokens, t.seq_len]
    if held_out and t.clip_windows:
        lower.insert(1, t.clip_windows)
    names = ", ".join(lower[:-1]) + f" or {lower[-1]}"
    return f"{why}. Lower {names}{t.where}, or {t.more_text}."
