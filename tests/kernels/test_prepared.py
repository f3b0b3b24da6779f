"""prepare_rotation: quantize_kv with R and mean @ R made once gives the bytes it gives when it
makes them per call, and refuses operands made for another x."""

from __future__ import annotations

import pytest
import torch

from oscar_zoo.kernels import PreparedRotation, fake_quantize_kv_vectorized, prepare_rotation, quantize_kv
from oscar_zoo.kernels import reference as ref
from oscar_zoo.zoo.errors import InvalidInput

from .conftest import random_orthogonal, run_poisoned, same_bits, signed_permutation

CASES = [  # d, x dtype, rotation kind, centered
    (64, torch.bfloat16, "per head", True),
    (128, torch.float16, "shared", False),
    (64, torch.float32, None, True),
    (256, torch.bfloat16, "per head", True),        # past FUSED_MAX_D: the matmul ahead of the kernel
]


def _rotation(kind, h, d, gen):
    if kind is None:
        return None
    if kind == "shared":
        return random_orthogonal(d, d, gen=gen)
    return random_orthogonal(h, d, d, gen=gen)


@pytest.mark.parametrize("d,xdt,rot,centered", CASES)
def test_prepared_operands_give_the_same_bytes(device, d, xdt, rot, centered):
    gen = torch.Generator().manual_seed(d + centered)
    h = 3
    x = (torch.randn(150, h, d, generator=gen) + torch.randn(h, d, generator=gen)).to(xdt).to(device)
    r = _rotation(rot, h, d, gen)
    mean = torch.randn(h, d, generator=gen) if centered else None
    # the plain tensors may sit on the CPU: prepared ones are moved once
    prep = prepare_rotation(r, mean, dtype=xdt, device=device)
    got = run_poisoned(lambda: quantize_kv(x, prep, [0.96, 0.9, 0.0], None, torch.float16))
    want = quantize_kv(x, r, [0.96, 0.9, 0.0], None, torch.float16, mean=mean)
    assert torch.equal(got[0], want[0]) and same_bits(got[1], want[1])
    # the operands themselves: R as x's dtype takes it, mean @ R in float64 rounded once (the
    # bytes above cannot tell a float32 product from it)
    if r is not None:
        assert torch.equal(prep.r.cpu(), r.to(xdt)) and prep.r.is_contiguous()
    if mean is not None:
        m_rot = mean.double() if r is None else ref.ref_rotate(mean[None], r)[0]
        assert same_bits(prep.mr.cpu(), m_rot.float())


def test_prepared_with_an_exact_rotation_matches_the_reference(device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(90, 2, 128, generator=gen).to(torch.bfloat16)
    r = torch.stack([signed_permutation(128, gen) for _ in range(2)])
    mean = torch.randn(2, 128, generator=gen)
    prep = prepare_rotation(r, mean, dtype=torch.bfloat16, device=device)
    packed, sz = quantize_kv(x.to(device), prep, 0.92, 32, torch.bfloat16)
    rp, rsz = ref.ref_quantize_kv(x, r, 0.92, 32, torch.bfloat16, mean=mean)
    assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)


def test_operands_made_for_another_x_are_refused(device):
    gen = torch.Generator().manual_seed(4)
    r, mean = random_orthogonal(2, 64, 64, gen=gen), torch.randn(2, 64, generator=gen)
    x = torch.randn(8, 2, 64, generator=gen).to(device)
    prep = prepare_rotation(r, mean, dtype=torch.bfloat16, device=device)
    with pytest.raises(InvalidInput, match=r"prepared for torch.bfloat16.*dtype=x.dtype"):
        quantize_kv(x, prep, 0.9)                                    # float32 x
    with pytest.raises(InvalidInput, match="holds its mean"):
        quantize_kv(x.bfloat16(), prep, 0.9, mean=mean.to(device))
    with pytest.raises(InvalidInput, match=r"\[kv_heads, d, d\] = \[3, 64, 64\]"):
        quantize_kv(torch.randn(8, 3, 64).bfloat16().to(device), prep, 0.9)
    with pytest.raises(InvalidInput, match=r"prepared for .* on meta"):
        quantize_kv(x.bfloat16(), prepare_rotation(r, mean, device="meta"), 0.9)


def test_the_torch_twins_take_only_plain_tensors():
    prep = prepare_rotation(torch.eye(64), dtype=torch.float32)
    with pytest.raises(InvalidInput, match="pass the plain R here"):
        fake_quantize_kv_vectorized(torch.randn(4, 1, 64), prep, 0.9)


def test_bad_operands_are_refused_when_prepared():
    with pytest.raises(InvalidInput, match="rotation must be"):
        prepare_rotation(torch.randn(4, 64, 32))
    with pytest.raises(InvalidInput, match="mean must be"):
        prepare_rotation(torch.eye(64), torch.randn(2, 32))
    with pytest.raises(InvalidInput, match=r"mean must be \[2, 64\] to match"):
        prepare_rotation(torch.eye(64).expand(2, 64, 64), torch.randn(1, 64))
    with pytest.raises(InvalidInput, match="dtype must be"):
        prepare_rotation(torch.eye(64), dtype=torch.int8)
    with pytest.raises(InvalidInput, match="rotation must be a tensor"):
        prepare_rotation([[1.0]])


def test_a_hand_made_one_laid_out_otherwise_is_refused():
    gen = torch.Generator().manual_seed(8)
    r = torch.linalg.qr(torch.randn(64, 64, generator=gen))[0]       # column-major
    x = torch.randn(8, 1, 64, generator=gen).bfloat16()
    hand = PreparedRotation(r.bfloat16(), None, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(InvalidInput, match="make it with prepare_rotation"):
        quantize_kv(x, hand, 0.9)
    # prepared copies: a later write to R does not reach them half-way (R but not mean @ R)
    r32 = torch.eye(64)
    prep = prepare_rotation(r32, dtype=torch.float32)
    r32.mul_(-1)
    assert torch.equal(prep.r, torch.eye(64))


def test_operands_of_a_rotation_that_requires_grad_hold_no_graph():
    r = torch.eye(64, requires_grad=True)
    m = torch.randn(2, 64, requires_grad=True)
    prep = prepare_rotation(r, m)
    assert prep.r.grad_fn is None and prep.mr.grad_fn is None and not prep.mr.requires_grad


def test_a_cuda_graph_replays_with_prepared_operands(device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(4096, 8, 128, generator=gen).bfloat16().to(device)
    prep = prepare_rotation(random_orthogonal(8, 128, 128, gen=gen), torch.randn(8, 128, generator=gen),
                            device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        quantize_kv(x, prep, 0.96, None, torch.float16)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = quantize_kv(x, prep, 0.96, None, torch.float16)
    x.copy_(torch.randn(4096, 8, 128, generator=gen).bfloat16())
    g.replay()
    torch.cuda.synchronize()
    want = quantize_kv(x, prep, 0.96, None, torch.float16)
    assert torch.equal(out[0], want[0]) and same_bits(out[1], want[1])
