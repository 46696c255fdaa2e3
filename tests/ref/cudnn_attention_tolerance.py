#!/usr/bin/python3
"""Emulate, on the CPU, how far cuDNN's bf16 fused attention may land from
flow's CPU bf16 attention, to justify the tolerances of tests/gpu/
test_cuda_kernels.c's attention_bf16 rows.

Usage (Debian's python3-torch; a minute on 2 cores):

    /usr/bin/python3 tests/ref/cudnn_attention_tolerance.py [SEEDS]

Both sides read q, k, v and dout in bf16 and sum products in fp32, and
store the output O and the gradient in bf16 (flow/kernels.h, "bf16
activations").  Where they differ:

- Forward.  The CPU normalises each probability, P = exp(s - lse), and
  rounds P to bf16 where it multiplies v.  A flash kernel goes over the
  keys tile by tile with a running maximum m, rounds the unnormalised
  exp(s - m) to bf16 where it multiplies v, and divides by the row's fp32
  sum at the end.  Emulated with key tiles of 64, 128 and 256.
- Backward.  cuDNN takes the softmax backward's rowsum(dout * O) from the
  stored bf16 O, where the CPU sums P * dP in fp32; it may form P as exp2
  with log2(e) folded into the scale (emulated: both forms); and it writes
  a bf16 gradient that flow then adds into dqkv and rounds again,
  bf16(dqkv + bf16(grad)), where the CPU rounds once, bf16(dqkv + grad).

The shapes and input distributions are the GPU test's (B 4, T 256, C 768,
NH 12, uniform in [-1, 1], dqkv's old contents too).  For each output the
script prints, over SEEDS seeds (default 8), the atol each needs beside the
test's relative slack of two bf16 roundings (2 * 2^-7 |cpu|).  The order of
the GPU's fp32 sums is not emulated: it moves results by fp32 rounding,
which flips a few elements' bf16 rounding by one ulp, inside that slack.
"""

import math
import sys

import torch

B, T, C, NH = 4, 256, 768, 12
HS = C // NH
SCALE = 1.0 / math.sqrt(HS)
SLACK = 2 * 2.0 ** -7  # the test's two bf16 roundings, relative


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def heads(x):
    return x.view(B, T, NH, HS).permute(0, 2, 1, 3)


def unheads(x):
    return x.permute(0, 2, 1, 3).reshape(B, T, C)


def scores(q, k):
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    s = (q @ k.transpose(-1, -2)) * SCALE
    return s.masked_fill(~causal, float("-inf"))


def forward_cpu(s, v):
    """flow's CPU kernel: normalised P rounded where it multiplies."""
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    return lse, bf16(bf16(p) @ v)


def forward_flash(s, v, tile):
    """Keys in tiles, unnormalised exp(s - m) rounded, one division."""
    o = torch.zeros(B, NH, T, HS)
    m = torch.full((B, NH, T, 1), -float("inf"))
    z = torch.zeros(B, NH, T, 1)
    for k0 in range(0, T, tile):
        st = s[..., k0:k0 + tile]
        mn = torch.maximum(m, st.max(-1, keepdim=True).values)
        # A row with no key yet (its tile all masked) keeps m = -inf.
        alpha = torch.nan_to_num(torch.exp(m - mn), nan=0.0)
        e = torch.nan_to_num(torch.exp(st - mn), nan=0.0)
        z = z * alpha + e.sum(-1, keepdim=True)
        o = o * alpha + bf16(e) @ v[..., k0:k0 + tile, :]
        m = mn
    return bf16(o / z)


def backward(q, k, v, g, s, lse, out, cudnn, exp2):
    """dq, dk, dv (fp32, not yet rounded) of one side."""
    if exp2:
        log2e = 1.4426950408889634
        p = torch.exp2(s * log2e - (lse * log2e)[..., None])
    else:
        p = torch.exp(s - lse[..., None])
    dp = g @ v.transpose(-1, -2)
    if cudnn:
        d = (out * g).sum(-1, keepdim=True)
    else:
        d = (p * dp).sum(-1, keepdim=True)
    ds = bf16(p * (dp - d) * SCALE)
    return ds @ k, ds.transpose(-1, -2) @ q, bf16(p).transpose(-1, -2) @ g


def need(cpu, gpu):
    """The atol that |gpu - cpu| <= atol + SLACK |cpu| needs."""
    err = (gpu.double() - cpu.double()).abs()
    return (err - SLACK * cpu.double().abs()).clamp(min=0).max().item()


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    worst = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    for seed in range(seeds):
        torch.manual_seed(seed)
        qkv = torch.rand(B, T, 3 * C) * 2 - 1
        dout = torch.rand(B, T, C) * 2 - 1
        old = bf16(torch.rand(B, T, 3 * C) * 2 - 1)
        q, k, v = (bf16(heads(t)) for t in qkv.split(C, dim=2))
        g = bf16(heads(dout))
        s = scores(q, k)
        lse, out = forward_cpu(s, v)
        for tile in (64, 128, 256):
            flash = forward_flash(s, v, tile)
            worst["out"] = max(worst["out"], need(out, flash))
        # The backward of both sides from the CPU's lse and out, as the
        # test gives them.
        cpu = torch.cat([unheads(x) for x in
                         backward(q, k, v, g, s, lse, out, False, False)], 2)
        cpu = bf16(old + cpu)
        for exp2 in (False, True):
            gpu = backward(q, k, v, g, s, lse, out, True, exp2)
            gpu = bf16(old + bf16(torch.cat([unheads(x) for x in gpu], 2)))
            for i, name in enumerate(("dq", "dk", "dv")):
                part = slice(i * C, (i + 1) * C)
                worst[name] = max(worst[name],
                                  need(cpu[..., part], gpu[..., part]))
        print(f"seed {seed}: " + ", ".join(f"{n} {w:.2e}"
                                           for n, w in worst.items()))
    print(f"atol needed beside the slack over {seeds} seeds: " +
          ", ".join(f"{n} {w:.2e}" for n, w in worst.items()))


if __name__ == "__main__":
    main()
