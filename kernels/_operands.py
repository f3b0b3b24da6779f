"""The rotation operands quantize_kv hands its kernel, made once per (rotation, mean).

Made per call they cost several small kernels (R cast to x's dtype; mean @ R in float64, then
float32) and a host-to-device copy when R lives on the CPU. Beside a decode step's few rows that
is most of the call, and in a CUDA graph each is a node replayed every time. Serving calls
quantize_kv with the same bundle tensors over and over, so they are kept, keyed by the tensors'
identity. An entry is served only while the tensors it was made from are alive and unchanged:
it holds weak references (a freed tensor drops its entries, and a new tensor reusing its id is a
miss) and the version counters torch bumps on every in-place write. Inference tensors
(torch.inference_mode) have no version counter and are never cached.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

MAX_ENTRIES = 64        # LRU: one per (layer, K or V) of a model being served or validated
_CACHE: OrderedDict = OrderedDict()


class _Entry:
    def __init__(self, key, rotation, mean, versions, r, mr):
        drop = _dropper(key, self)
        self.refs = tuple(None if t is None else weakref.ref(t, drop) for t in (rotation, mean))
        self.versions = versions
        # r is rotation itself when it already had the device, dtype and layout: keep no strong
        # reference to it, or it would never be freed while cached
        self.r = None if r is rotation else r
        self.mr = mr

    def serves(self, rotation, mean) -> bool:
        # (which of the two is None is part of the key)
        return all(t is None or (ref() is t and _version(t) == ver)
                   for ref, ver, t in zip(self.refs, self.versions, (rotation, mean)))


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:    # an inference tensor: in-place writes to it cannot be seen
        return None


def _dropper(key, entry):
    def drop(_):
        if _CACHE.get(key) is entry:
            del _CACHE[key]
    return drop


def operands(rotation: torch.Tensor | None, mean: torch.Tensor | None, dtype: torch.dtype,
             dev: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(R in `dtype` on `dev`, contiguous: [d, d] | [H, d, d]; mean @ R rounded once from float64
    to float32: [H, d]), either None when its input is."""
    if rotation is None and mean is None:
        return None, None
    versions = tuple(None if t is None else _version(t) for t in (rotation, mean))
    if any(t is not None and v is None for t, v in zip((rotation, mean), versions)):
        return _make(rotation, mean, dtype, dev)
    key = (id(rotation), id(mean), dtype, str(dev))
    entry = _CACHE.get(key)
    if entry is not None and entry.serves(rotation, mean):
        _CACHE.move_to_end(key)
        return (rotation if entry.r is None else entry.r), entry.mr
    r, mr = _make(rotation, mean, dtype, dev)
    _CACHE[key] = _Entry(key, rotation, mean, versions, r, mr)
    while len(_CACHE) > MAX_ENTRIES:
        _CACHE.popitem(last=False)
    return r, mr


def _make(rotation, mean, dtype, dev):
    # 16-bit x: R rounded to x's dtype for the tensor cores (as serving rotates), fp32 x: fp32 R
    r = rotation.to(device=dev, dtype=dtype).contiguous() if rotation is not None else None
    mr = None
    if mean is not None:    # centering after the rotation: (x - m) @ R = x @ R - m @ R, exact R
        m64, r64 = mean.double().to(dev), None if rotation is None else rotation.double().to(dev)
        mr = (m64 if r64 is None else (m64 @ r64 if r64.dim() == 2
                                       else torch.einsum("hd,hde->he", m64, r64))).float().contiguous()
    return r, mr
