#!/usr/bin/python3
"""Emulate, on the CPU, how far cuDNN's bf16 fused attention may land from
flow's CPU bf16 attention, to justify the tolerance of tests/gpu/
test_cuda_kernels.c's attention_bf16 rows.

Usage (Debian's python3-torch):

    /usr/bin/python3 tests/ref/cudnn_attention_tolerance.py

Both sides read q, k, v and dout in bf16 and sum products in fp32, both
round the probabilities (and the softmax's gradient) to bf16 where they
multiply, and both store the output O and dq, dk, dv in bf16 (flow/
kernels.h, "bf16 activations": flow's CPU kernel rounds them too, its
activations being bf16).  What still differs is the rowsum of the
softmax's backward: cuDNN's fused backward takes rowsum(dout * O) from the
stored bf16 O, where the CPU sums P * dP in fp32.  The shapes and input
distributions are the GPU test's (B 4, T 256, C 768, NH 12, uniform in
[-1, 1]).  Prints, per output, the largest error, the atol each needs at
rtol 1e-2, and how many elements differ (by one bf16 ulp, and by more).
The order of the GPU's fp32 sums is not emulated: it moves results by
fp32 rounding, which flips a few elements' bf16 rounding by one ulp.
"""

import math

import torch

B, T, C, NH = 4, 256, 768, 12
HS = C // NH
RTOL = 1e-2


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def heads(x):
    return x.view(B, T, NH, HS).permute(0, 2, 1, 3)


def attention(q, k, v, g, cudnn_like):
    """lse, out, dq, dk, dv of one side, from bf16-rounded inputs."""
    scale = 1.0 / math.sqrt(HS)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    out = bf16(bf16(p) @ v)
    dp = g @ v.transpose(-1, -2)
    if cudnn_like:
        d = (out * g).sum(-1, keepdim=True)
    else:
        d = (p * dp).sum(-1, keepdim=True)
    ds = p * (dp - d) * scale
    dq = bf16(bf16(ds) @ k)
    dk = bf16(bf16(ds).transpose(-1, -2) @ q)
    dv = bf16(bf16(p).transpose(-1, -2) @ g)
    return lse, out, dq, dk, dv


def main():
    torch.manual_seed(0)
    qkv = torch.rand(B, T, 3 * C) * 2 - 1
    dout = torch.rand(B, T, C) * 2 - 1
    q, k, v = (bf16(heads(t)) for t in qkv.split(C, dim=2))
    g = bf16(heads(dout))
    cpu = attention(q, k, v, g, cudnn_like=False)
    fused = attention(q, k, v, g, cudnn_like=True)
    for name, a, b in zip(("lse", "out", "dq", "dk", "dv"), cpu, fused):
        a, b = a.double(), b.double()
        err = (a - b).abs()
        need = (err - RTOL * a.abs()).clamp(min=0).max().item()
        # A bf16 ulp of a: 2^(floor(log2|a|) - 7).
        ulp = torch.exp2(torch.floor(torch.log2(a.abs().clamp(min=1e-30)))
                         - 7)
        one = int(((err > 0) & (err <= ulp)).sum())
        more = int((err > ulp).sum())
        print(f"{name}\tmax_abs_err {err.max().item():.3e}\t"
              f"atol needed at rtol {RTOL:g}: {need:.3e}\t"
              f"{one} of {a.numel()} one bf16 ulp off, {more} more")


if __name__ == "__main__":
    main()
