"""R and mean @ R as quantize_kv's kernel takes them, made once.

quantize_kv given a plain rotation (and mean) casts R to x's dtype and computes mean @ R in
float64 on every call: five small kernels ahead of the quantize kernel, most of the time of a
decode-sized call, and nodes of any CUDA graph it is captured in. A serving engine quantizes
with the same bundle every step, so it prepares each layer's rotation once and passes that
instead: each call is then one kernel launch. The prepared tensors are the caller's, like any
other argument: a CUDA graph captured with them reads them at replay, so keep them alive as long
as the graph, and prepare again after changing the rotation or mean (nothing is cached behind
the caller's back).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscar_zoo.zoo.errors import InvalidInput

from . import _args


@dataclass(frozen=True, eq=False)
class PreparedRotation:
    """Made by prepare_rotation; quantize_kv checks it against x before the kernel reads it."""
    r: torch.Tensor | None      # [d, d] | [H, d, d] in `dtype` on `device`, contiguous
    mr: torch.Tensor | None     # [H, d] float32: mean @ R in float64, rounded once
    dtype: torch.dtype          # x's dtype this was made for
    device: torch.device

    def check(self, x: torch.Tensor, heads: int, d: int) -> None:
        if x.dtype != self.dtype or x.device != self.device:
            raise InvalidInput(f"the rotation was prepared for {self.dtype} on {self.device}, x is "
                               f"{x.dtype} on {x.device}: prepare_rotation(..., dtype=x.dtype, "
                               "device=x.device)")
        _args.check_rotation(self.r, heads, d)
        _args.check_mean(self.mr, heads, d)
        # the kernel reads raw storage with no strides: a hand-made one must be laid out as ours
        for t, want in ((self.r, self.dtype), (self.mr, torch.float32)):
            if t is not None and (t.dtype != want or t.device != self.device or not t.is_contiguous()):
                raise InvalidInput("this PreparedRotation was not made by prepare_rotation (a tensor of "
                                   "another dtype, device or layout): make it with prepare_rotation")


def prepare_rotation(rotation: torch.Tensor | None, mean: torch.Tensor | None = None,
                     dtype: torch.dtype = torch.bfloat16,
                     device: torch.device | str | None = None) -> PreparedRotation:
    """The operands for quantize_kv on x of `dtype` on `device` (default: the rotation's, else the
    mean's, else the CPU): pass the result as quantize_kv's `rotation`, and no `mean`. They are
    copies: changing R or the mean later needs a new prepare_rotation."""
    if dtype not in _args.FLOAT_DTYPES:
        raise InvalidInput(f"dtype must be x's: float32, float16 or bfloat16, got {dtype}.")
    for name, t in (("rotation", rotation), ("mean", mean)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise InvalidInput(f"{name} must be a tensor or None, got {type(t).__name__}.")
    src = rotation if rotation is not None else mean
    dev = torch.device(device) if device is not None else (src.device if src is not None else torch.device("cpu"))
    if dev.type == "cuda" and dev.index is None:    # x.device always has its index
        dev = torch.device("cuda", torch.cuda.current_device())
    if rotation is not None and (rotation.dim() not in (2, 3) or rotation.shape[-1] != rotation.shape[-2]):
        raise InvalidInput(f"rotation must be [d, d] or [kv_heads, d, d], got {tuple(rotation.shape)}.")
    if mean is not None and (mean.dim() != 2 or (rotation is not None and (
            mean.shape[-1] != rotation.shape[-1] or (rotation.dim() == 3 and mean.shape[0] != rotation.shape[0])))):
        want = "[kv_heads, d]" if rotation is None else \
            f"[{rotation.shape[0] if rotation.dim() == 3 else 'kv_heads'}, {rotation.shape[-1]}] to match the rotation"
        raise InvalidInput(f"mean must be {want}, got {tuple(mean.shape)}.")
    r, mr = operands(rotation, mean, dtype, dev)
    if r is not None and r.data_ptr() == rotation.data_ptr():   # no cast or move happened
        r = r.clone()
    return PreparedRotation(r, mr, dtype, dev)


@torch.no_grad()    # a rotation that requires grad must not tie the operands to its graph
def operands(rotation, mean, dtype: torch.dtype, dev: torch.device):
    """(R in `dtype` on `dev`, contiguous; mean @ R rounded once from float64 to float32), either
    None when its input is."""
    # 16-bit x: R rounded to x's dtype for the tensor cores (as serving rotates), fp32 x: fp32 R
    r = rotation.to(device=dev, dtype=dtype).contiguous() if rotation is not None else None
    mr = None
    if mean is not None:    # centering after the rotation: (x - m) @ R = x @ R - m @ R, exact R
        m64, r64 = mean.double().to(dev), None if rotation is None else rotation.double().to(dev)
        mr = (m64 if r64 is None else (m64 @ r64 if r64.dim() == 2
                                       else torch.einsum("hd,hde->he", m64, r64))).float().contiguous()
    return r, mr
