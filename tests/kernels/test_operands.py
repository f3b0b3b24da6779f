"""The rotation operands quantize_kv caches per (rotation, mean): served only while the tensors
they came from are alive and unchanged."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from oscar_zoo.kernels import _operands, quantize_kv
from oscar_zoo.kernels import reference as ref

from .conftest import random_orthogonal, same_bits


@pytest.fixture(autouse=True)
def empty_cache():
    _operands._CACHE.clear()
    yield
    _operands._CACHE.clear()


def _fresh(h=3, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return random_orthogonal(h, d, d, gen=gen), torch.randn(h, d, generator=gen)


def _want(r, m, dtype=torch.bfloat16):
    # independent of the module: mean @ R in float64 per head
    return r.to(dtype), torch.einsum("hd,hde->he", m.double(), r.double()).float()


def test_a_second_call_is_served_from_the_cache():
    r, m = _fresh()
    a = _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    b = _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    assert a[0] is b[0] and a[1] is b[1]
    want = _want(r, m)
    assert same_bits(a[0], want[0]) and same_bits(a[1], want[1])
    # another dtype or mean is another entry
    c = _operands.operands(r, None, torch.float32, torch.device("cpu"))
    assert c[1] is None and same_bits(c[0], r) and len(_operands._CACHE) == 2


@pytest.mark.parametrize("which", ["rotation", "mean"])
def test_an_in_place_write_is_seen(which):
    r, m = _fresh()
    first = _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    if which == "rotation":
        r[0] = r[0].flip(0)
    else:
        m.mul_(2)
    again = _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    want = _want(r, m)
    assert same_bits(again[0], want[0]) and same_bits(again[1], want[1])
    assert not (same_bits(first[0], want[0]) and same_bits(first[1], want[1]))


def test_quantize_kv_after_an_in_place_write_matches_the_reference(device):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 2, 64, generator=gen)
    r = torch.stack([torch.eye(64), torch.eye(64).flip(0)]).to(device)     # exact in float32
    m = torch.randn(2, 64, generator=gen).to(device)
    quantize_kv(x.to(device), r, 0.9, None, mean=m)
    r[1] = -r[1]
    m.add_(1.0)
    packed, sz = quantize_kv(x.to(device), r, 0.9, None, mean=m)
    rp, rsz = ref.ref_quantize_kv(x, r.cpu(), 0.9, None, mean=m.cpu())
    assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)


def test_a_freed_tensor_drops_its_entry_and_is_not_kept_alive():
    r, m = _fresh()
    _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    # R already in the wanted dtype and layout is used as it is, and must not be kept alive
    r32 = r.clone()
    _operands.operands(r32, None, torch.float32, torch.device("cpu"))
    assert len(_operands._CACHE) == 2
    w = weakref.ref(r32)
    del r32
    gc.collect()
    assert w() is None and len(_operands._CACHE) == 1
    del m
    gc.collect()
    assert len(_operands._CACHE) == 0


def test_inference_tensors_are_not_cached_and_still_right():
    with torch.inference_mode():
        r, m = _fresh()
        got = _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    want = _want(r, m)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])
    assert len(_operands._CACHE) == 0


def test_the_cache_is_bounded():
    keep = [_fresh(h=1, seed=i) for i in range(_operands.MAX_ENTRIES + 5)]
    for r, m in keep:
        _operands.operands(r, m, torch.bfloat16, torch.device("cpu"))
    assert len(_operands._CACHE) == _operands.MAX_ENTRIES
    # the oldest went first
    assert _operands.operands(*keep[-1], torch.bfloat16, torch.device("cpu"))[0] is \
        _operands.operands(*keep[-1], torch.bfloat16, torch.device("cpu"))[0]
    assert (id(keep[0][0]), id(keep[0][1]), torch.bfloat16, "cpu") not in _operands._CACHE
