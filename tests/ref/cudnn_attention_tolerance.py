#!/usr/bin/python3
"""Emulate, on the CPU, how far cuDNN's bf16 fused attention may land from
flow's CPU bf16 attention, to justify the tolerance of tests/gpu/
test_cuda_kernels.c's attention_bf16 rows.

Usage (Debian's python3-torch):

    /usr/bin/python3 tests/ref/cudnn_attention_tolerance.py

Both sides round q, k, v and dout to bf16 and sum products in fp32, and both
round the probabilities (and the softmax's gradient) to bf16 where they
multiply.  What differs is where cuDNN's fused kernels round that flow's CPU
kernel does not: the output O comes back in bf16, the backward pass takes
rowsum(dout * O) from that bf16 O (and bf16 dout) where the CPU sums
P * dP in fp32, and dq, dk, dv come back in bf16.  The shapes and input
distributions are the GPU test's (B 4, T 256, C 768, NH 12, uniform in
[-1, 1]).  Prints, per output, the largest error and the atol each needs at
rtol 1e-2: the test allows 3e-3 for dqkv (it printed 1.4e-3 for dq and
1.3e-3 for dk with PyTorch 1.13) and 1e-3 for out (none needed).  The
order of the GPU's fp32 sums is not emulated: it moves results by fp32
rounding, far below these.
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
    out = bf16(p) @ v
    dp = g @ v.transpose(-1, -2)
    if cudnn_like:
        out = bf16(out)
        d = (out * g).sum(-1, keepdim=True)
    else:
        d = (p * dp).sum(-1, keepdim=True)
    ds = p * (dp - d) * scale
    dq = bf16(ds) @ k
    dk = bf16(ds).transpose(-1, -2) @ q
    dv = bf16(p).transpose(-1, -2) @ g
    if cudnn_like:
        dq, dk, dv = bf16(dq), bf16(dk), bf16(dv)
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
        print(f"{name}\tmax_abs_err {err.max().item():.3e}\t"
              f"atol needed at rtol {RTOL:g}: {need:.3e}")


if __name__ == "__main__":
    main()
