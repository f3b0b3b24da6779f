"""One quantize_kv call on the bench's shape (bf16, per-head rotation, centering, clip 0.96), after
a warm-up: the target for `ncu --kernel-name regex:_quantize --launch-skip 1 --launch-count 1`."""

import torch

from oscar_zoo.kernels import quantize_kv

x = torch.randn(262144, 8, 128, device="cuda", dtype=torch.bfloat16)
r = torch.linalg.qr(torch.randn(8, 128, 128, device="cuda"))[0].contiguous()
mean = torch.randn(8, 128, device="cuda")
for _ in range(2):
    quantize_kv(x, r, torch.full((8,), 0.96), None, torch.float16, mean=mean)
torch.cuda.synchronize()
