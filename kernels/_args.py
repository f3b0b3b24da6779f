"""Argument checks and normalisation shared by the kernels and their references."""

from __future__ import annotations

import torch

from oscar_zoo.zoo.errors import InvalidInput

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_x(x: torch.Tensor, name: str = "x") -> tuple[int, int, int]:
    # x: [tokens, kv_heads, d]
    if x.dim() != 3:
        raise InvalidInput(f"{name} must be [tokens, kv_heads, head_dim], got shape {tuple(x.shape)}.")
    if x.dtype not in FLOAT_DTYPES:
        raise InvalidInput(f"{name} must be float32, float16 or bfloat16, got {x.dtype}.")
    t, h, d = x.shape
    check_head_dim(d)
    return t, h, d


def check_head_dim(d: int) -> None:
    if d < 64 or d & (d - 1):
        raise InvalidInput(f"head_dim must be a power of two >= 64 (the kernels split it in four "
                           f"quarters of >= 16 for the tensor cores), got {d}.")


def group_count(d: int, group_size: int | None) -> int:
    g = d if group_size is None else int(group_size)
    if g < 4 or g & (g - 1) or g > d:
        raise InvalidInput(f"group_size must be a power of two between 4 and head_dim={d}, got {group_size}.")
    return d // g


def check_scale_dtype(dtype: torch.dtype) -> None:
    if dtype not in SCALE_DTYPES:
        raise InvalidInput(f"scale_dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}.")


def clip_ratios(clip, heads: int) -> torch.Tensor:
    """Clip ratio per KV head as float64 on the CPU: [kv_heads]. Accepts a number, a 0-d tensor,
    or a tensor with one axis of size 1 or kv_heads, its other axes of size 1 (e.g. [1],
    [kv_heads], [kv_heads, 1], [1, kv_heads]). A [2, 2] for 4 heads is refused, not flattened."""
    c = torch.as_tensor(clip, dtype=torch.float64).detach().cpu()
    c = c.reshape([n for n in c.shape if n != 1])            # drop the size-1 axes
    try:
        if c.dim() > 1:
            raise RuntimeError
        c = torch.broadcast_to(c, (heads,)).clone()
    except RuntimeError:
        raise InvalidInput(f"clip must be a number or broadcast to [kv_heads={heads}], "
                           f"got shape {tuple(torch.as_tensor(clip).shape)}.") from None
    if not torch.isfinite(c).all():
        raise InvalidInput("clip ratios must be finite; use 0 (or any value <= 0) to disable clipping.")
    return c


def check_rotation(rotation: torch.Tensor | None, heads: int, d: int, name: str = "rotation") -> None:
    if rotation is None:
        return
    if not isinstance(rotation, torch.Tensor):
        raise InvalidInput(f"{name} must be a tensor, got {type(rotation).__name__} (a prepared rotation "
                           "is for quantize_kv and fake_quantize_kv; pass the plain R here).")
    ok = tuple(rotation.shape) in ((d, d), (heads, d, d))
    if not ok:
        raise InvalidInput(f"{name} must be [d, d] or [kv_heads, d, d] = [{heads}, {d}, {d}], "
                           f"got {tuple(rotation.shape)}.")


def check_mean(mean: torch.Tensor | None, heads: int, d: int) -> None:
    if mean is not None and tuple(mean.shape) != (heads, d):
        raise InvalidInput(f"mean must be [kv_heads, d] = [{heads}, {d}], got {tuple(mean.shape)}.")


def per_head(rotation: torch.Tensor, heads: int) -> torch.Tensor:
    """[d, d] or [kv_heads, d, d] -> [kv_heads, d, d] (a view when possible)."""
    return rotation.expand(heads, *rotation.shape[-2:]) if rotation.dim() == 2 else rotation
