"""Write OSCAR `.pt` rotation checkpoints without torch.

SGLang wants `torch.save` zip archives; exports and mirrors make them on the client path, which
must not import torch. Rotation files only need dicts of str/int keys, numbers, strings and
dense tensors, so this emits exactly that subset of the format: a protocol-2 pickle plus the
zip layout torch expects (checked against `torch.load(weights_only=True)` in
tests/zoo/test_pt_writer.py). Output is deterministic: the same tensors give the same bytes.

Reading goes the other way through torch only (oscar_pt.load_pt, `weights_only=True`): a
pickle from a hub is untrusted input.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..files import atomic_writer

_WRITE_STORAGE = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
                  np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage",
                  np.dtype(np.int32): "IntStorage", np.dtype(np.uint8): "ByteStorage",
                  np.dtype(np.bool_): "BoolStorage"}


class _Emitter:
    """Protocol-2 pickle of dict/list/tuple/str/int/float/bool/None and numpy tensors."""

    def __init__(self):
        self.out = io.BytesIO()
        self.storages: list[np.ndarray] = []

    def emit(self, obj) -> None:
        w = self.out.write
        if obj is None:
            w(pickle.NONE)
        elif obj is True or obj is False:
            w(pickle.NEWTRUE if obj else pickle.NEWFALSE)
        elif isinstance(obj, (int, np.integer)):
            self._int(int(obj))
        elif isinstance(obj, (float, np.floating)):
            w(pickle.BINFLOAT + struct.pack(">d", float(obj)))
        elif isinstance(obj, str):
            data = obj.encode("utf-8")
            w(pickle.BINUNICODE + struct.pack("<I", len(data)) + data)
        elif isinstance(obj, dict):
            w(pickle.EMPTY_DICT)
            if obj:
                w(pickle.MARK)
                for k, v in obj.items():
                    self.emit(k)
                    self.emit(v)
                w(pickle.SETITEMS)
        elif isinstance(obj, list):
            w(pickle.EMPTY_LIST)
            if obj:
                w(pickle.MARK)
                for v in obj:
                    self.emit(v)
                w(pickle.APPENDS)
        elif isinstance(obj, tuple):
            self._tuple(obj)
        elif isinstance(obj, np.ndarray):
            self._tensor(obj)
        else:
            raise TypeError(f"cannot write {type(obj).__name__} into a rotation checkpoint")

    def _int(self, n: int) -> None:
        w = self.out.write
        if 0 <= n < 256:
            w(pickle.BININT1 + bytes([n]))
        elif 0 <= n < 65536:
            w(pickle.BININT2 + struct.pack("<H", n))
        elif -(1 << 31) <= n < (1 << 31):
            w(pickle.BININT + struct.pack("<i", n))
        else:
            data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
            w(pickle.LONG1 + bytes([len(data)]) + data)

    def _tuple(self, items) -> None:
        self.out.write(pickle.MARK)
        for v in items:
            self.emit(v)
        self.out.write(pickle.TUPLE)

    def _global(self, module: str, name: str) -> None:
        self.out.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())

    def _tensor(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _WRITE_STORAGE:
            raise TypeError(f"cannot write a {arr.dtype} tensor")
        key = str(len(self.storages))
        self.storages.append(arr)
        strides = tuple(s // arr.itemsize for s in arr.strides)
        w = self.out.write
        self._global("torch._utils", "_rebuild_tensor_v2")
        w(pickle.MARK)
        w(pickle.MARK)  # persistent id: ('storage', <type>, key, 'cpu', numel)
        self.emit("storage")
        self._global("torch", _WRITE_STORAGE[arr.dtype])
        self.emit(key)
        self.emit("cpu")
        self.emit(int(arr.size))
        w(pickle.TUPLE + pickle.BINPERSID)
        self.emit(0)
        self._tuple(tuple(int(s) for s in arr.shape))
        self._tuple(strides)
        self.emit(False)
        self._global("collections", "OrderedDict")
        w(pickle.EMPTY_TUPLE + pickle.REDUCE)
        w(pickle.TUPLE + pickle.REDUCE)


def _add(archive: zipfile.ZipFile, fileobj: BinaryIO, name: str, data: bytes, align: int = 64) -> None:
    """Store one entry; pad the local header so the data starts on a 64-byte boundary (torch's
    reader can then mmap tensors)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    header = 30 + len(name.encode()) + 4
    pad = (-(fileobj.tell() + header)) % align
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # 'FB' padding field, like torch
    archive.writestr(info, data)


def dumps(obj: Any, archive_name: str = "archive") -> bytes:
    """The bytes `torch.save(obj)` would produce, up to layout details torch does not read."""
    em = _Emitter()
    em.emit(obj)
    em.out.write(pickle.STOP)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        _add(archive, buf, f"{archive_name}/data.pkl", b"\x80\x02" + em.out.getvalue())
        _add(archive, buf, f"{archive_name}/.format_version", b"1")
        _add(archive, buf, f"{archive_name}/.storage_alignment", b"64")
        _add(archive, buf, f"{archive_name}/byteorder", b"little")
        for i, arr in enumerate(em.storages):
            _add(archive, buf, f"{archive_name}/data/{i}", arr.astype(arr.dtype.newbyteorder("<")).tobytes())
        _add(archive, buf, f"{archive_name}/version", b"3\n")
    return buf.getvalue()


def dump(obj: Any, path: str | Path, durable: bool = True) -> None:
    """Write `obj` as a torch checkpoint at `path`, atomically (temp file + rename). With
    durable=False the data is not fsynced: for derived files that can be rebuilt (exports)."""
    path = Path(path)
    data = dumps(obj, archive_name=path.stem or "archive")
    if durable:
        with atomic_writer(path) as f:
            f.write(data)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
