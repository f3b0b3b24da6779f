"""dequantize_kv: exact against the reference's float32 arithmetic, and within float32 rounding
of float64, on random bytes and random scales of every dtype and group size."""

from __future__ import annotations

import pytest
import torch

from oscar_zoo.kernels import dequantize_kv
from oscar_zoo.kernels import reference as ref
from oscar_zoo.zoo.errors import InvalidInput

from .conftest import run_poisoned


@pytest.mark.parametrize("d,gs", [(64, None), (128, 32), (128, 8), (256, 128)])
@pytest.mark.parametrize("sdt", [torch.float32, torch.float16, torch.bfloat16])
def test_dequant_exact(device, d, gs, sdt):
    gen = torch.Generator().manual_seed(d + (gs or 0))
    t, h, ng = 77, 3, d // (gs or d)
    packed = torch.randint(0, 256, (t, h, d // 4), generator=gen, dtype=torch.uint8)
    sz = torch.stack([torch.rand(t, h, ng, generator=gen) * 0.5 + 1e-3, torch.rand(t, h, ng, generator=gen) * 3],
                     -1).view(t, h, 2 * ng).to(sdt)
    got = run_poisoned(lambda: dequantize_kv(packed.to(device), sz.to(device), gs)).cpu()
    assert got.dtype == torch.float32 and got.shape == (t, h, d)
    assert torch.equal(got, ref.ref_dequantize_kv(packed, sz, gs, dtype=torch.float32))
    exact = ref.ref_dequantize_kv(packed, sz, gs)
    assert ((got.double() - exact).abs() <= 2 ** -22 * exact.abs() + 2 ** -24 * sz.float().abs().max()).all()


def test_unpack_order_is_quarter_strided(device):
    # byte j = dims j, j+d/4, j+d/2, j+3d/4 at bits [1:0], [3:2], [5:4], [7:6]
    packed = torch.zeros(1, 1, 16, dtype=torch.uint8)
    packed[0, 0, 3] = 0b11_10_01_00                                   # dims 3, 19, 35, 51 -> 0, 1, 2, 3
    sz = torch.tensor([[[1.0, 0.0]]])
    got = dequantize_kv(packed.to(device), sz.to(device)).cpu()[0, 0]
    want = torch.zeros(64)
    want[[19, 35, 51]] = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(got, want)


def test_bad_input(device):
    with pytest.raises(InvalidInput, match="scales_zeros"):
        dequantize_kv(torch.zeros(2, 1, 16, dtype=torch.uint8, device=device), torch.zeros(2, 1, 4, device=device))
    with pytest.raises(InvalidInput, match="uint8"):
        dequantize_kv(torch.zeros(2, 1, 16, device=device), torch.zeros(2, 1, 2, device=device))


def test_scales_on_another_device_are_refused(device):
    """Compiled, a CPU scales_zeros beside CUDA codes stopped in Triton's launcher ("Pointer
    argument cannot be accessed from Triton"); now the message says to move one of them."""
    packed = torch.zeros(2, 1, 16, dtype=torch.uint8, device=device)
    other = "meta" if device.type == "cpu" else "cpu"
    with pytest.raises(InvalidInput, match="scales_zeros is on .* packed on"):
        dequantize_kv(packed, torch.zeros(2, 1, 2, device=other))
