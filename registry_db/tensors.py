"""Byte-level safetensors: where each tensor lies in a file, and new files built from ranges.

The format: 8 bytes little-endian header length N, N bytes of JSON
{name: {dtype, shape, data_offsets: [begin, end]}} with offsets relative to the data that
follows the header. Working on bytes lets the registry cut one layer (or one KV head) out of
a stored bundle without loading the rest, and stream a layer range as a new file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ..zoo.errors import BundleFormatError

MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
DTYPE_BYTES = {"F32": 4}


@dataclass(frozen=True)
class TensorSpan:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int        # absolute offset in the file
    end: int          # exclusive

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_spans(path: str | Path) -> dict[str, TensorSpan]:
    """Every tensor's absolute byte range. Raises BundleFormatError for a malformed header."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise BundleFormatError(f"{Path(path).name}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise BundleFormatError(f"{Path(path).name}: header of {n} bytes is too large")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise BundleFormatError(f"{Path(path).name}: header is not JSON") from None
    base = 8 + n
    spans = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        spans[name] = TensorSpan(name, info["dtype"], tuple(info["shape"]), base + begin, base + end)
    return spans


def head_span(span: TensorSpan, head: int) -> TensorSpan:
    """The bytes of sub-tensor `head` of a stacked [h, ...] tensor (row-major, so contiguous)."""
    per = span.nbytes // span.shape[0]
    start = span.start + head * per
    return TensorSpan(f"{span.name}[{head}]", span.dtype, span.shape[1:], start, start + per)


def build_header(spans: list[TensorSpan], metadata: dict[str, str] | None = None) -> bytes:
    """The header of a new file holding `spans` back to back, in the given order."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for s in spans:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8-byte alignment
    return struct.pack("<Q", len(raw)) + raw
