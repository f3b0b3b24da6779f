import torch, sys
sys.path.insert(0, "tests")
from oscar_zoo.kernels import Int2KVCache, decode_attention, decode
from oscar_zoo.kernels import reference as ref
from dataclasses import fields, replace
SINK, RECENT, PAGE = 16, 32, 32
def cpu(c): return replace(c, **{f.name: getattr(c, f.name).cpu() for f in fields(c) if isinstance(getattr(c, f.name), torch.Tensor)})
for dev in ["cuda"]:
  for tau in (0.0, 6.0):
    decode.TAU = tau
    for late in (3.0, 12.0, 40.0):
        gen = torch.Generator().manual_seed(int(late)); d, n = 64, 400
        q = torch.randn(1, 2, d, generator=gen); keys = torch.randn(n, 1, d, generator=gen) * 0.05
        values = torch.randn(n, 1, d, generator=gen) * 0.5 + torch.randn(d, generator=gen); unit = q[0, 0] / q[0, 0].norm()
        keys[100, 0] = unit * (2.0 / (1.4426950408889634 * q[0, 0].norm())); keys[300, 0] = unit * (late / (1.4426950408889634 * q[0, 0].norm()))
        cache = Int2KVCache.from_dense([keys.to(dev)], [values.to(dev)], None, None, 0.0, 0.0, sink=SINK, recent=RECENT, page_size=PAGE)
        out = decode_attention(q.to(dev), cache, sm_scale=1.0).cpu().double()
        want = ref.ref_decode_attention(q, cpu(cache), sm_scale=1.0)
        print(dev, tau, late, ((out - want).norm(dim=-1) / want.norm(dim=-1)).tolist(), flush=True)
