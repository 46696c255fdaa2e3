#!/usr/bin/python3
"""Generate the PyTorch reference fixtures for flow's CPU kernels.

Usage (Debian's python3-torch; plain `python3` may be a pyenv without torch):

    /usr/bin/python3 tests/ref/gen_kernels.py tests/ref/fixtures

Every case is deterministic (a fixed seed per case) and small.  Inputs are
drawn in float32 and stored as float32.  References are computed by PyTorch
in float64 from those float32 inputs and then rounded to float32, so the C
kernels are compared with the exact answer rather than with PyTorch's own
float32 rounding; the exceptions are AdamW and clip_grad_norm_, which run in
float32 because the point there is to reproduce torch.optim's arithmetic.
The format is described in tests/ref/fixture.py and tests/ref/README.md.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture import write_fixture  # noqa: E402

F64 = torch.float64


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).float()


def f32(t):
    return t.detach().to(torch.float32).numpy()


def i32(t):
    return t.detach().to(torch.int32).numpy()


# ---- one function per op; each returns {case name: {array name: array}} ----

def linear_inputs(g, n, i, o):
    """inp, weight, bias and dout of an nn.Linear case, drawn in order."""
    inp = randn(g, n, i)
    w = randn(g, o, i, scale=1.0 / math.sqrt(i))
    return inp, w, randn(g, o), randn(g, n, o)


def matmul_cases():
    cases = {}
    for name, (n, i, o, has_bias, seed) in {
        "matmul_small": (37, 19, 23, True, 1),
        "matmul_row1": (1, 8, 5, True, 2),
        "matmul_nobias": (64, 48, 33, False, 3),
        "matmul_wide": (40, 96, 72, True, 4),
    }.items():
        inp, w, b, dout = linear_inputs(gen(seed), n, i, o)
        x = inp.to(F64).requires_grad_()
        wd = w.to(F64).requires_grad_()
        bd = b.to(F64).requires_grad_() if has_bias else None
        out = F.linear(x, wd, bd)
        out.backward(dout.to(F64))
        a = {"dims": np.array([n, i, o], np.int32), "inp": f32(inp),
             "weight": f32(w), "dout": f32(dout), "out": f32(out),
             "dinp": f32(x.grad), "dweight": f32(wd.grad)}
        if has_bias:
            a["bias"] = f32(b)
            a["dbias"] = f32(bd.grad)
        cases[name] = a
    return cases


def bf16(t):
    """t rounded to bfloat16 (to nearest even) and back, in float64."""
    return t.to(torch.bfloat16).to(F64)


def matmul_bf16_cases():
    """nn.Linear with bf16 GEMM operands and exact (float64) sums: what
    tensor cores compute for bf16 inputs with fp32 accumulation, to
    rounding.  inp, weight and dout are rounded to bf16 before every
    product; dbias sums the unrounded dout."""
    cases = {}
    for name, (n, i, o, has_bias, seed) in {
        "matmul_bf16_small": (37, 19, 23, True, 5),
        "matmul_bf16_nobias": (64, 48, 33, False, 6),
        "matmul_bf16_wide": (40, 96, 72, True, 7),
    }.items():
        inp, w, b, dout = linear_inputs(gen(seed), n, i, o)
        x, wd, gd = bf16(inp), bf16(w), bf16(dout)
        out = x @ wd.T
        if has_bias:
            out = out + b.to(F64)
        a = {"dims": np.array([n, i, o], np.int32), "inp": f32(inp),
             "weight": f32(w), "dout": f32(dout), "out": f32(out),
             "dinp": f32(gd @ wd), "dweight": f32(gd.T @ x)}
        if has_bias:
            a["bias"] = f32(b)
            a["dbias"] = f32(dout.to(F64).sum(0))
        cases[name] = a
    return cases


def embedding_cases():
    cases = {}
    for name, (B, T, C, V, seed) in {
        "embedding_small": (2, 7, 13, 5, 11),  # V < B*T: tokens repeat
        "embedding_t1": (1, 1, 8, 3, 12),
        "embedding_wide": (3, 9, 70, 11, 13),  # C spans two channel blocks
    }.items():
        g = gen(seed)
        tokens = torch.randint(0, V, (B, T), generator=g)
        wte = randn(g, V, C)
        wpe = randn(g, T, C)
        dout = randn(g, B, T, C)
        te = wte.to(F64).requires_grad_()
        pe = wpe.to(F64).requires_grad_()
        out = F.embedding(tokens, te) + pe.unsqueeze(0)
        out.backward(dout.to(F64))
        cases[name] = {"dims": np.array([B, T, C, V], np.int32),
                       "tokens": i32(tokens), "wte": f32(wte),
                       "wpe": f32(wpe), "dout": f32(dout), "out": f32(out),
                       "dwte": f32(te.grad), "dwpe": f32(pe.grad)}
    return cases


def layernorm_cases():
    cases = {}
    for name, (n, C, offset, seed) in {
        "layernorm_small": (13, 37, 0.0, 21),
        "layernorm_c768": (4, 768, 5.0, 22),  # |mean| >> std
        "layernorm_c1": (3, 1, 0.0, 23),  # variance 0: out = bias
        "layernorm_rows": (130, 24, 0.0, 24),
    }.items():
        g = gen(seed)
        inp = randn(g, n, C) + offset
        w = randn(g, C)
        b = randn(g, C)
        dout = randn(g, n, C)
        x = inp.to(F64).requires_grad_()
        wd = w.to(F64).requires_grad_()
        bd = b.to(F64).requires_grad_()
        out = F.layer_norm(x, (C,), wd, bd, eps=1e-5)
        out.backward(dout.to(F64))
        xd = inp.to(F64)
        mean = xd.mean(-1)
        rstd = 1.0 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5)
        cases[name] = {"dims": np.array([n, C], np.int32), "inp": f32(inp),
                       "weight": f32(w), "bias": f32(b), "dout": f32(dout),
                       "out": f32(out), "mean": f32(mean),
                       "rstd": f32(rstd), "dinp": f32(x.grad),
                       "dweight": f32(wd.grad), "dbias": f32(bd.grad)}
    return cases


def gelu_cases():
    g = gen(31)
    # The bulk in the active range, plus the tails where tanh saturates.
    inp = torch.cat([randn(g, 997, scale=2.0),
                     torch.tensor([-12.0, -5.5, -3.0, 0.0, 1e-4, 3.0,
                                   5.5, 12.0, 30.0])]).float()
    dout = randn(g, inp.numel())
    x = inp.to(F64).requires_grad_()
    out = F.gelu(x, approximate="tanh")
    out.backward(dout.to(F64))
    return {"gelu": {"dims": np.array([inp.numel()], np.int32),
                     "inp": f32(inp), "dout": f32(dout), "out": f32(out),
                     "dinp": f32(x.grad)}}


def attention_ref(qkv, B, T, C, NH):
    hs = C // NH
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    pre = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    pre = pre.masked_fill(~mask, float("-inf"))
    att = torch.softmax(pre, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    # What the forward pass keeps for backward: (B, NH, T).
    lse = torch.logsumexp(pre, dim=-1)
    return y, lse


def attention_cases():
    cases = {}
    for name, (B, T, C, NH, seed) in {
        "attention_small": (2, 5, 12, 3, 41),
        "attention_t1": (1, 1, 6, 2, 42),
        "attention_odd": (2, 17, 15, 5, 43),  # hs = 3, NH odd
        "attention_t64": (1, 64, 32, 2, 44),
    }.items():
        g = gen(seed)
        qkv = randn(g, B, T, 3 * C)
        dout = randn(g, B, T, C)
        x = qkv.to(F64).requires_grad_()
        y, lse = attention_ref(x, B, T, C, NH)
        y.backward(dout.to(F64))
        cases[name] = {"dims": np.array([B, T, C, NH], np.int32),
                       "qkv": f32(qkv), "dout": f32(dout), "out": f32(y),
                       "lse": f32(lse), "dqkv": f32(x.grad)}
    return cases


def bf16(t):
    """t (float64) as a kernel rounds it: to float32, then to bfloat16 to
    nearest even; back in float64."""
    return t.to(torch.float32).to(torch.bfloat16).to(F64)


def attention_bf16_ref(qkv, dout, B, T, C, NH):
    """--precision bf16's attention (flow/kernels.h), written out in
    float64: q, k, v and dout rounded, the probabilities (from the float32
    lse) rounded where they multiply v and dout, dpre rounded where it
    multiplies q and k."""
    hs = C // NH
    scale = 1.0 / math.sqrt(hs)
    heads = lambda x: x.view(B, T, NH, hs).transpose(1, 2)
    q, k, v = (heads(x) for x in bf16(qkv).split(C, dim=2))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    # The probabilities from lse as saved, in float32 (flow/kernels.h):
    # a bf16 rounding of p must see the kernels' p, not a neighbour.
    lse = torch.logsumexp(s, dim=-1).to(torch.float32).to(F64)
    p = torch.exp(s - lse[..., None])
    y = (bf16(p) @ v).transpose(1, 2).reshape(B, T, C)
    g = heads(bf16(dout))
    dp = g @ v.transpose(-2, -1)
    dpre = bf16(scale * p * (dp - (p * dp).sum(-1, keepdim=True)))
    dq = dpre @ k
    dk = dpre.transpose(-2, -1) @ q
    dv = bf16(p).transpose(-2, -1) @ g
    merge = lambda x: x.transpose(1, 2).reshape(B, T, C)
    return y, lse, torch.cat([merge(dq), merge(dk), merge(dv)], dim=2)


def attention_bf16_cases():
    cases = {}
    for name, (B, T, C, NH, seed) in {
        "attention_bf16_small": (2, 5, 12, 3, 45),
        "attention_bf16_odd": (2, 17, 15, 5, 46),
        "attention_bf16_t64": (1, 64, 32, 2, 47),
    }.items():
        g = gen(seed)
        qkv = randn(g, B, T, 3 * C)
        dout = randn(g, B, T, C)
        y, lse, dqkv = attention_bf16_ref(qkv.to(F64), dout.to(F64), B, T,
                                          C, NH)
        cases[name] = {"dims": np.array([B, T, C, NH], np.int32),
                       "qkv": f32(qkv), "dout": f32(dout), "out": f32(y),
                       "lse": f32(lse), "dqkv": f32(dqkv)}
    return cases


def residual_cases():
    g = gen(51)
    a, b, dout = randn(g, 37), randn(g, 37), randn(g, 37)
    return {"residual": {"dims": np.array([37], np.int32), "a": f32(a),
                         "b": f32(b), "dout": f32(dout),
                         "out": f32(a.to(F64) + b.to(F64))}}


def cross_entropy_cases():
    cases = {}
    for name, (n, V, Vp, scale, seed) in {
        # Targets -1 and -100 are both ignored rows.
        "cross_entropy_small": (6, 11, 16, 2.0, 61),
        "cross_entropy_gpt2": (1, 50257, 50304, 3.0, 62),
    }.items():
        g = gen(seed)
        logits = randn(g, n, Vp, scale=scale)
        targets = torch.randint(0, V, (n,), generator=g)
        if n > 1:
            targets[1] = -1
            targets[4] = -100
            targets[5] = V - 1  # the last real column, next to the padding
            logits[3] += 60.0  # large logits: the softmax must be stable
        logits[:, V:] = 1e4  # padding must never take probability
        valid = (targets >= 0).sum().item()
        dloss = np.float32(1.0 / valid)
        x = logits.to(F64).requires_grad_()
        tt = torch.where(targets < 0, torch.full_like(targets, -100), targets)
        losses = F.cross_entropy(x[:, :V], tt, reduction="none",
                                 ignore_index=-100)
        (losses * float(dloss)).sum().backward()
        cases[name] = {"dims": np.array([n, V, Vp], np.int32),
                       "dloss": np.array(dloss, np.float32),
                       "logits": f32(logits), "targets": i32(targets),
                       "losses": f32(losses), "dlogits": f32(x.grad)}
    return cases


def adamw_cases():
    cases = {}
    steps = 5
    for name, (n, lr, wd, decay, pscale, seed) in {
        "adamw_decay": (37, 0.05, 0.1, True, 1.0, 71),
        "adamw_nodecay": (45, 0.01, 0.1, False, 0.01, 72),
    }.items():
        g = gen(seed)
        # The hyperparameters as float32 values, so PyTorch (Python floats)
        # and flow (float fields) start from the very same numbers.
        lr, wd = float(np.float32(lr)), float(np.float32(wd))
        b1, b2 = float(np.float32(0.9)), float(np.float32(0.95))
        eps = float(np.float32(1e-8))
        p0 = randn(g, n, scale=pscale)
        grads = randn(g, steps, n, scale=pscale)
        p = torch.nn.Parameter(p0.clone())
        opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps,
                                weight_decay=wd if decay else 0.0,
                                foreach=False)
        ps, ms, vs = [], [], []
        for s in range(steps):
            p.grad = grads[s].clone()
            opt.step()
            st = opt.state[p]
            ps.append(p.detach().clone())
            ms.append(st["exp_avg"].clone())
            vs.append(st["exp_avg_sq"].clone())
        cases[name] = {
            "dims": np.array([n, steps, 1 if decay else 0], np.int32),
            "hparams": np.array([lr, b1, b2, eps, wd], np.float32),
            "param0": f32(p0), "grads": f32(grads),
            "params": f32(torch.stack(ps)), "m": f32(torch.stack(ms)),
            "v": f32(torch.stack(vs))}
    return cases


def grad_norm_cases():
    cases = {}
    for name, (factor, seed) in {
        "grad_norm_clip": (0.25, 81),  # max_norm below the norm: clips
        "grad_norm_noclip": (4.0, 82),  # max_norm above the norm: no-op
    }.items():
        g = gen(seed)
        sizes = [37, 100, 5]
        grads = [randn(g, k) for k in sizes]
        norm = torch.norm(torch.stack([torch.norm(t) for t in grads]))
        max_norm = float(np.float32(factor * norm.item()))
        params = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
        for prm, t in zip(params, grads):
            prm.grad = t.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        a = {"dims": np.array(sizes, np.int32),
             "max_norm": np.array(max_norm, np.float32),
             "norm": np.array(total.item(), np.float32)}
        for k, (t, prm) in enumerate(zip(grads, params)):
            a[f"grad{k}"] = f32(t)
            a[f"clipped{k}"] = f32(prm.grad)
        cases[name] = a
    return cases


def main(argv):
    if len(argv) != 2:
        print("usage: gen_kernels.py OUTDIR", file=sys.stderr)
        return 2
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    total = 0
    for make in (matmul_cases, matmul_bf16_cases, embedding_cases, layernorm_cases, gelu_cases,
                 attention_cases, attention_bf16_cases, residual_cases, cross_entropy_cases,
                 adamw_cases, grad_norm_cases):
        for name, arrays in make().items():
            total += write_fixture(os.path.join(outdir, name + ".bin"),
                                   arrays)
    print(f"wrote {total} bytes of fixtures to {outdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
