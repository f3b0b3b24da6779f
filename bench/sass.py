"""Compile the INT2 kernels for sm_90 without a GPU; print registers, shared memory, spills and
the instruction mix of the two largest loops (a conditional block inside a loop counts in full).
Needs the Triton the GPU image has (3.6) on the path:

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 .venv/bin/python -P bench/sass.py [decode|quantize|quantize-hopper] [--clip-count K] [--dump DIR]

Counts are of the SASS text (cuobjdump from Triton's own CUDA tools): a leading view of what a
change does to the loop before spending device time on it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from oscar_zoo.kernels import decode, quantize

TARGET = GPUTarget("cuda", 90, 32)


def _sig(kern, types: dict, consts: dict, div16=()) -> ASTSource:
    """Pointers and the ints in `div16` get the 16-divisibility a launch would find (without it
    every load compiles to bytes)."""
    fn = kern._compiled
    sig = {name: ("constexpr" if name in consts else types[name]) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in consts and (types[name].startswith("*") or name in div16)}
    return ASTSource(fn, sig, constexprs=consts, attrs=attrs)


def stage1(pdl: bool = True):
    i32, p = "i32", lambda t: f"*{t}"  # noqa: E731
    types = dict(q_ptr=p("fp32"), qh_ptr=p("fp16"), qv_ptr=p("fp32"), lens_ptr=p("i32"), bt_ptr=p("i32"),
                 stride_bt=i32, kq_ptr=p("u8"), ksz_ptr=p("fp16"), vq_ptr=p("u8"), vsz_ptr=p("fp16"),
                 hk_ptr=p("bf16"), hv_ptr=p("bf16"), o_ptr=p("fp32"), lse_ptr=p("fp32"), Hkv=i32,
                 qk_scale="fp32", SPLIT_LEN=i32, NSPL=i32)
    consts = dict(D=128, GQA=4, BLOCK_H=8, NG=1, P=256, SINK=64, RECENT=256, BLOCK_N=decode.BLOCK_N,
                  BLOCK_HP=16, INTERP=False, PDL=pdl, TRIGGER=False, PF_CHUNK=decode.PF_CHUNK, PF_AHEAD=decode.PF_AHEAD, TAU=decode.TAU)
    consts = {k: v for k, v in consts.items() if k in decode._stage1._compiled.arg_names}
    opts = dict(num_warps=decode.NUM_WARPS, num_stages=decode.NUM_STAGES)
    if decode.MAXNREG:
        opts["maxnreg"] = decode.MAXNREG
    return _sig(decode._stage1, types, consts, div16=("SPLIT_LEN", "NSPL")), opts


def quant(kmax: int = 6):
    i32, p = "i32", lambda t: f"*{t}"  # noqa: E731
    types = dict(x_ptr=p("bf16"), r_ptr=p("bf16"), mr_ptr=p("fp32"), k_ptr=p("i32"), e_ptr=p("fp32"), out_ptr=p("u8"),
                 sz_ptr=p("fp16"), T=i32, stride_xt=i32, stride_xh=i32, H=i32, NTB=i32)
    consts = dict(D=128, NG=1, BLOCK_T=quantize.BLOCK_T, KMAX=kmax, HAS_R=True, R_PER_HEAD=True, HAS_MEAN=True,
                  SZ_KIND=1, DOT_PREC="tf32", INTERP=False, EST=kmax > quantize.KFAST, NCAP=quantize.NCAP)
    names = quantize._quantize_kernel._compiled.arg_names
    types = {k: v for k, v in types.items() if k in names}
    consts = {k: v for k, v in consts.items() if k in names}
    opts = dict(num_warps=quantize.NUM_WARPS)
    if quantize.MAXNREG:
        opts["maxnreg"] = quantize.MAXNREG
    return _sig(quantize._quantize_kernel, types, consts, div16=("T", "stride_xt", "stride_xh")), opts


def quant_hopper(kmax: int = 6):
    """quantize_hopper's kernel as quantize_kv launches it for the bench's call (bf16 x, per-head
    R, centering, fp16 scale/zero); its tensor descriptors' types come from CPU stand-ins."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from oscar_zoo.kernels import quantize_hopper as qh

    bt, d, h = qh.BLOCK_T, 128, 8
    x = torch.empty(4096, h * d, dtype=torch.bfloat16)
    r = torch.empty(h * d, d, dtype=torch.bfloat16)
    descs = {"x_desc": TensorDescriptor(x, list(x.shape), [h * d, 1], [bt, d],
                                        gl.NVMMASharedLayout.get_default_for([bt, d], gl.bfloat16)),
             "r_desc": TensorDescriptor(r, list(r.shape), [d, 1], [d, d],
                                        gl.NVMMASharedLayout.get_default_for([d, d], gl.bfloat16))}
    types = dict(mr_ptr="*fp32", k_ptr="*i32", e_ptr="*fp32", out_ptr="*u8", sz_ptr="*fp16", T="i32", H="i32",
                 NTB="i32", **{k: mangle_type(v) for k, v in descs.items()})
    consts = dict(D=d, BLOCK_T=bt, KMAX=kmax, R_PER_HEAD=True, HAS_MEAN=True, SZ_KIND=1,
                  EST=kmax > quantize.KFAST, NCAP=quantize.NCAP)
    fn = qh._quantize_hopper_kernel
    sig = {name: ("constexpr" if name in consts else types[name]) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in consts and types[name].startswith("*")}
    return GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), dict(num_warps=qh.NUM_WARPS, maxnreg=qh.MAXNREG)


def cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def loops(sass: str) -> list[tuple[int, int, list[str]]]:
    """(start, end, instructions) of every backward branch's body, largest first."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    out = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ln)
        lab = re.search(r"BRA .*\.L_x_(\d+)", ln)
        if lab:
            target = next((j for j, x in enumerate(lines) if f".L_x_{lab.group(1)}:" in x), None)
        elif m and m.group(1):
            target = addr.index(int(m.group(1), 16)) if int(m.group(1), 16) in addr else None
        else:
            target = None
        if target is not None and target < i:
            out.append((target, i, [x.split("*/", 1)[1].strip() for x in lines[target:i + 1]]))
    return sorted(out, key=lambda t: -(t[1] - t[0]))


def opcode(ins: str) -> str:
    ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
    return ins.split()[0].split(".")[0] if ins else "?"


def report(name: str, src, opts, dump: str | None) -> None:
    k = triton.compile(src, target=TARGET, options=opts)
    sass = cuobjdump(k.asm["cubin"], "-sass")
    res = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", cuobjdump(k.asm["cubin"], "-res-usage"))
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            with open(os.path.join(dump, f"{name}.{ext}"), "w") as f:
                f.write(k.asm[ext])
        with open(os.path.join(dump, f"{name}.sass"), "w") as f:
            f.write(sass)
    n = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M))
    print(f"{name}: {res.group(1)} registers, {k.metadata.shared} B shared, stack {res.group(2)} B, {n} instructions")
    for start, end, body in loops(sass)[:2]:
        mix = collections.Counter(opcode(x) for x in body)
        top = ", ".join(f"{op} {n}" for op, n in mix.most_common(14))
        print(f"  loop of {len(body)} instructions: {top}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("which", nargs="*", default=["decode", "quantize"])
    ap.add_argument("--dump", help="write ttgir, ptx and sass here")
    ap.add_argument("--clip-count", type=int, default=6,
                    help="quantize's largest k (above quantize.KFAST: the estimate's build)")
    args = ap.parse_args()
    if "decode" in args.which:
        report("stage1", *stage1(), args.dump)
    if "quantize" in args.which:
        report("quantize", *quant(args.clip_count), args.dump)
    if "quantize-hopper" in args.which:
        report("quantize_hopper", *quant_hopper(args.clip_count), args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
