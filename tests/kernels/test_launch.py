"""The interpreted launch path (CPU tensors): it must run our kernels whichever Triton the
machine has, including the GPU image's 3.6 with numpy >= 2.4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.errors import InterpreterError

from oscar_zoo.kernels._launch import kernel


def _strided_fill(out_ptr, N):
    # the persistent-grid loop quantize uses: range() over a program id and runtime ints
    for i in range(tl.program_id(0), N, tl.num_programs(0)):
        tl.store(out_ptr + i, i * 10 + tl.program_id(0))


strided_fill = kernel(_strided_fill)


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
