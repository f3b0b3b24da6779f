"""Choosing, per call, between compiled Triton and Triton's CPU interpreter.

Triton decides interpreter-or-compiler when `@triton.jit` runs (it reads TRITON_INTERPRET then),
and a compiled kernel needs a GPU driver even for CPU tensors. Setting the variable at import
would be global and order-dependent (whoever imports triton first wins), and would stop a GPU
machine from validating on CPU tensors. So each kernel here is built both ways and the call
picks by device:

- CUDA tensors run compiled, unless TRITON_INTERPRET=1 is set (then interpreted, for debugging);
- CPU tensors always run in the interpreter (`validate` and the CPU test suite rely on this);
- anything else is refused with a clear message.

The interpreter restores its own `triton.language` patches after a launch (Triton >= 3.6), but
not those a call to a `@jit` helper from inside the kernel makes (`_language_restored` puts
those back), so both kinds can run in one process. One more thing is needed: Triton's standard library
(`tl.max`, `tl.sum`, ...) is itself made of `@jit` functions, built compiled or interpreted when
`triton.language` is first imported. While an interpreted launch runs, `_stdlib_interpreted`
swaps the compiled ones for interpreted twins and puts them back after, so the interpreter works
whatever TRITON_INTERPRET was at import time and whoever imported triton first. Our own `@triton.jit`
helpers (module-level functions in this package that kernels call) are swapped the same way, and
Triton 3.6's scalar-to-index conversion, which numpy >= 2.4 breaks, is mended (`_scalar_index`). This
is not thread-safe (neither is Triton's interpreter). Block shapes differ by kind (big blocks in the
interpreter, where each program is a Python loop iteration over numpy arrays).
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from triton.runtime import interpreter as _interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from oscar_zoo.zoo.errors import InvalidInput


class DualKernel:
    """A Triton kernel available compiled (CUDA) and interpreted (CPU)."""

    def __init__(self, fn):
        self.fn = fn
        self._compiled = JITFunction(fn)
        self._interpreted = InterpretedFunction(fn)

    def on(self, device: torch.device):
        """The launcher for tensors on `device` (index it with the grid)."""
        return _Interpreted(self._interpreted) if interpreted(device) else self._compiled


class _Interpreted:
    def __init__(self, fn: InterpretedFunction):
        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _language_restored(), _stdlib_interpreted(), _scalar_index():
                return self.fn[grid](*args, **kwargs)
        return launch


_TWINS: dict[int, InterpretedFunction] = {}

try:  # imported lazily by Triton during a launch; it must see the real standard library
    import triton.experimental.gluon  # noqa: F401
except ImportError:  # pragma: no cover - older Triton
    pass


@contextlib.contextmanager
def _stdlib_interpreted():
    swapped = []
    for name, mod in list(sys.modules.items()):
        if not (name.startswith("triton.language") or name.startswith(__package__ + ".")) or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            if isinstance(val, JITFunction):
                twin = _TWINS.setdefault(id(val), InterpretedFunction(val.fn))
                swapped.append((mod, attr, val))
                setattr(mod, attr, twin)
    try:
        yield
    finally:
        for mod, attr, val in reversed(swapped):
            setattr(mod, attr, val)


@contextlib.contextmanager
def _language_restored():
    """Everything in triton.language's modules and classes as it was before the launch.

    Triton's interpreter patches triton.language while a kernel runs and restores it after
    (since triton-lang/triton#8735), except for a `@jit` helper called from the kernel (Triton
    3.6 to 3.9: a device-function call patches the namespaces the helper's module sees, tl.core
    for the standard library's tl.max, and keeps no record to restore them). Left patched,
    every later compile in this process failed in the code generator ("'value' object has no
    attribute 'dtype'"). A module keeps the names it gained: the interpreter's rewritten
    functions look theirs up there."""
    saved = [(ns, dict(vars(ns))) for ns in _language_namespaces()]
    try:
        yield
    finally:
        for ns, before in saved:
            now = vars(ns)
            if isinstance(ns, type):
                for name in [n for n in now if n not in before]:
                    delattr(ns, name)
            for name, val in before.items():
                if now.get(name, _MISSING) is not val:
                    setattr(ns, name, val)


_MISSING = object()


def _language_namespaces() -> list:
    """triton.language's modules and the classes defined in them (tensor, dtype, ...)."""
    mods = [m for name, m in list(sys.modules.items())
            if m is not None and (name == "triton.language" or name.startswith("triton.language."))]
    classes = {id(v): v for m in mods for v in vars(m).values()
               if isinstance(v, type) and (v.__module__ or "").startswith("triton.language")}
    return mods + list(classes.values())


@contextlib.contextmanager
def _scalar_index():
    """Triton 3.6's interpreter turns a scalar into an index with int() of a one-element array,
    which numpy >= 2.4 refuses, so every `range()` over a program id or a runtime int fails on
    CPU tensors (triton-lang/triton#9171; Triton 3.9 squeezes first). The GPU image pairs 3.6
    with such a numpy; for the launch, the interpreter's tensor patch gets the squeeze too."""
    patch = _interpreter._patch_lang_tensor

    def patch_squeezed(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    _interpreter._patch_lang_tensor = patch_squeezed
    try:
        yield
    finally:
        _interpreter._patch_lang_tensor = patch


# Tests set this to "a" or "b": every output and workspace buffer then starts filled with a
# sentinel (floats NaN / +inf, integers 0x55 / 0xAA) instead of whatever memory held, so an
# element a kernel forgot to write shows up as a difference between the two runs.
POISON: str | None = None
_SENTINEL = {"a": (float("nan"), 0x55), "b": (float("inf"), 0xAA)}


def new_buffer(shape, dtype: torch.dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON is not None:
        f, i = _SENTINEL[POISON]
        out.fill_(f if dtype.is_floating_point else i)
    return out


def kernel(fn) -> DualKernel:
    return DualKernel(fn)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (grids are sized per SM)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreted(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    raise InvalidInput(f"oscar_zoo.kernels runs on CUDA or CPU tensors, got a tensor on {device}; "
                       "move it with .cuda() or .cpu().")
