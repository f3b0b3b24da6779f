"""The interpreted launch path (CPU tensors): it must run our kernels whichever Triton the
machine has, including the GPU image's 3.6 with numpy >= 2.4, and leave compiled kernels
working in the same process."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import interpreter
from triton.runtime.errors import InterpreterError

from oscar_zoo.kernels._launch import kernel


def _strided_fill(out_ptr, N):
    # the persistent-grid loop quantize uses: range() over a program id and runtime ints
    for i in range(tl.program_id(0), N, tl.num_programs(0)):
        tl.store(out_ptr + i, i * 10 + tl.program_id(0))


strided_fill = kernel(_strided_fill)


def _row_max(x_ptr, out_ptr, N: tl.constexpr):
    # tl.max is a @jit function of Triton's standard library: the interpreter runs it as a
    # device-function call
    offs = tl.arange(0, N)
    tl.store(out_ptr + tl.program_id(0), tl.max(tl.load(x_ptr + tl.program_id(0) * N + offs), axis=0))


row_max = kernel(_row_max)


def _as_triton_36(monkeypatch):
    """CI has Triton 3.9, so 3.6's scalar-to-index conversion, int() of a one-element array, is
    put back in its interpreter's tensor patch here (triton-lang/triton#9171)."""
    patch = interpreter._patch_lang_tensor

    def patch_36(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch_36)


def test_range_over_scalars_runs_under_triton_36_conversion(monkeypatch):
    try:
        int(np.zeros(1))
        pytest.skip("this numpy still converts one-element arrays, so 3.6's conversion works")
    except TypeError:
        pass
    _as_triton_36(monkeypatch)
    out = torch.full((11,), -1, dtype=torch.int32)
    with pytest.raises(InterpreterError, match="0-dimensional"):   # the bug, reproduced
        interpreter.InterpretedFunction(_strided_fill)[(3,)](out, 11)
    strided_fill.on(torch.device("cpu"))[(3,)](out, 11)
    want = torch.arange(11, dtype=torch.int32) * 10 + torch.arange(11, dtype=torch.int32) % 3
    assert torch.equal(out, want)
    assert interpreter._patch_lang_tensor.__name__ == "patch_36", "the launch must restore the patch"


def _language() -> tuple[dict, dict]:
    """triton.language's module attributes, and those of the classes its modules define."""
    mods, classes = {}, {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, val in list(vars(mod).items()):
            mods[(name, attr)] = val
            if isinstance(val, type) and val.__module__.startswith("triton.language"):
                for cattr, cval in list(vars(val).items()):
                    classes[(val.__qualname__, cattr)] = cval
    return mods, classes


def test_an_interpreted_launch_leaves_triton_language_and_later_compiles_alone(tmp_path, monkeypatch):
    """The interpreter's device-function call (tl.max here) patched tl.core and never put it
    back: every later compile in the process then failed in the code generator ("'value'
    object has no attribute 'dtype'"), as a GPU machine validating on CPU tensors would see.
    The compile is for sm_90 without a GPU (the code generator is where it failed)."""
    before = _language()
    x = torch.randn(3, 16)
    out = torch.empty(3)
    row_max.on(torch.device("cpu"))[(3,)](x, out, N=16)
    assert torch.equal(out, x.max(dim=1).values)
    after = _language()
    # a module may gain names (the interpreter's rewritten helpers find theirs there); nothing
    # that was there may change, and no class may gain one
    changed = [str(k) for i in (0, 1) for k in before[i] if after[i].get(k) is not before[i][k]]
    changed += [str(k) for k in after[1].keys() - before[1].keys()]
    assert not changed, f"{len(changed)} attributes left changed, e.g. {sorted(changed)[:5]}"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))   # a compile, not a cache hit
    src = ASTSource(row_max._compiled, {"x_ptr": "*fp32", "out_ptr": "*fp32", "N": "constexpr"},
                    constexprs={"N": 16})
    assert ".entry" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
