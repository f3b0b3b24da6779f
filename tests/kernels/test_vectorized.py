"""The vectorised torch twin of the INT2 round trip gives the kernels' numbers (it is what
validation uses on CPUs, where the kernels would run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from oscar_zoo.kernels import fake_quantize_kv
from oscar_zoo.kernels import reference as ref
from oscar_zoo.kernels.vectorized import fake_quantize_kv_vectorized

from .conftest import signed_permutation


@pytest.mark.parametrize("d, gs", [(64, None), (64, 16), (128, 32)])
@pytest.mark.parametrize("sdt", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("centered", [False, True])
def test_bit_exact_with_the_kernel_for_exact_rotations(device, d, gs, sdt, centered):
    g = torch.Generator().manual_seed(d + (gs or 0) + int(centered))
    h = 3
    x = (torch.randn(37, h, d, generator=g) * torch.rand(d, generator=g) * 4).to(device)
    rot = torch.stack([signed_permutation(d, g) for _ in range(h)]).to(device)
    clip = torch.tensor([0.0, 0.8, 0.97]).to(device)
    mean = torch.randn(h, d, generator=g).to(device) if centered else None
    want = fake_quantize_kv(x, rot, clip, gs, mean=mean, scale_dtype=sdt)
    got = fake_quantize_kv_vectorized(x, rot, clip, gs, mean=mean, scale_dtype=sdt)
    assert torch.equal(got, want)


def test_general_rotation_differs_only_by_float32_rounding(device):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(200, 2, 64, generator=g).to(device)
    rot = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0].float().to(device)
    want = fake_quantize_kv(x, rot, 0.9, 64)
    got = fake_quantize_kv_vectorized(x, rot, 0.9, 64)
    step = (want.amax(-1) - want.amin(-1)).amax() / 3
    differing = (got - want).abs() > 1e-4
    assert differing.float().mean() < 1e-3                     # a code flips only at a tie
    assert ((got - want).abs() <= step * 1.01 + 1e-5).all()


@pytest.mark.parametrize("xdt", [torch.bfloat16, torch.float16])
def test_16_bit_input_rounds_the_rotation_as_the_kernel_does(device, xdt):
    """The twin rotated 16-bit x by a float32 R while the kernel's tensor cores take R in x's
    dtype: 90% of bf16 elements differed, by up to one INT2 step."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 2, 64, generator=g).to(xdt).to(device)
    rot = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0].float().to(device)
    want = fake_quantize_kv(x, rot, 0.9, 32)
    got = fake_quantize_kv_vectorized(x, rot, 0.9, 32)
    assert ((got - want).abs() > 1e-4).float().mean() < 1e-2    # float32 rounding: a rare tie only


@pytest.mark.parametrize("xdt", [torch.bfloat16, torch.float16])
def test_16_bit_input_centers_with_the_exact_rotation_as_the_kernel_does(device, xdt):
    """The kernel subtracts mean @ R with R exact; the twin used R rounded to x's dtype there
    too: every element differed, by up to one INT2 step. x = 0 leaves only the centering, so
    the two must agree bit for bit."""
    g = torch.Generator().manual_seed(4)
    x = torch.zeros(16, 2, 64, dtype=xdt, device=device)
    rot = torch.linalg.qr(torch.randn(2, 64, 64, generator=g, dtype=torch.float64))[0].float().to(device)
    mean = (10 * torch.randn(2, 64, generator=g)).to(device)
    want = fake_quantize_kv(x, rot, 0.9, 32, mean=mean)
    got = fake_quantize_kv_vectorized(x, rot, 0.9, 32, mean=mean)
    assert torch.equal(got, want)


def test_twin_refuses_the_arguments_the_kernel_refuses(device):
    """Validation runs the twin on CPUs and the kernel on GPUs: the twin broadcast a mean of [d]
    or [1, d] over the heads (the kernel refuses it) and failed in einsum on a rotation with the
    wrong head count, so the same call passed on one machine and failed on the other."""
    from oscar_zoo.zoo.errors import InvalidInput

    g = torch.Generator().manual_seed(6)
    x = torch.randn(9, 2, 64, generator=g).to(device)
    bad = {"mean": dict(mean=torch.zeros(64, device=device)),
           "mean must": dict(mean=torch.zeros(1, 64, device=device)),
           "rotation must": dict(rotation=torch.eye(64, device=device).expand(3, 64, 64)),
           "clip must": dict(clip=torch.full((1, 2, 2), 0.9))}                       # 4 ratios for 2 heads
    for msg, kw in bad.items():
        args = dict(rotation=None, clip=0.9, mean=None) | kw
        for fn in (fake_quantize_kv, fake_quantize_kv_vectorized):
            with pytest.raises(InvalidInput, match=msg):
                fn(x, args["rotation"], args["clip"], mean=args["mean"])
    # what both accept, they compute alike: mean [kv_heads, d] on the CPU, clip [1, kv_heads]
    mean = torch.randn(2, 64, generator=g)
    clip = torch.tensor([[0.9, 0.8]])
    want = fake_quantize_kv(x, None, clip, 32, mean=mean)
    assert torch.equal(fake_quantize_kv_vectorized(x, None, clip, 32, mean=mean), want)
    ref_out = ref.ref_fake_quantize_kv(x.cpu(), None, [0.9, 0.8], 32, mean=mean)
    assert (want.cpu().double() - ref_out).abs().max() < 1e-6
