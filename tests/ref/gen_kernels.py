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
The bf16 twins' fixtures (*_bf16*, checked by tests/unit/test_kernels_bf16.c)
hold bf16 values wherever a kernel reads or writes bf16, each expected bf16
value rounded once from float64 (see "the bf16 twins" below).
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
from torch_gpt import round_bf16  # noqa: E402  (float64 -> bf16, once)

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


# ---- the bf16 twins (flow/kernels.h, "bf16 activations") -------------------
#
# Inputs a kernel reads as bf16 are bf16 values (drawn as above, then
# rounded), stored as float32, exactly.  Weights, biases and the residual
# stream are float32 values that are not bf16 values, so a kernel that
# forgets to round a weight for its product fails.  Every expected bf16
# value is the float64 result from those exact inputs rounded ONCE to the
# nearest bf16 (bf16(), never through float32, which rounds twice); every
# expected fp32 value is rounded once to float32.  A bf16 gradient that a
# kernel accumulates into starts from nonzero bf16 values (<name>_start)
# and the fixture holds both results: <name> from zeros and <name>_acc =
# bf16(<name>_start + the exact gradient), the rounding of the sum, not a
# sum of roundings.  fp32 gradients hold what the kernel adds, as above.

def bf16(t):
    """t rounded once to the nearest bfloat16, ties to even, as a float64
    tensor (torch_gpt.round_bf16 of the exact float64 value)."""
    return round_bf16(t.to(F64))


def randn_bf16(g, *shape, scale=1.0):
    """randn()'s values rounded to bf16: a tensor stored in bf16."""
    return bf16(randn(g, *shape, scale=scale))


def need_bf16(case, arrays, names):
    """Fail unless each of names holds bf16 values only."""
    for k in names:
        x = torch.from_numpy(arrays[k]).to(F64)
        if not torch.equal(bf16(x), x):
            raise AssertionError(f"{case}: {k} holds a value that is not "
                                 f"a bf16 value")


def matmul_bf16_cases():
    """out = bf16(inp . bf16(weight)^T + bf16(bias)); dinp = bf16(dinp +
    dout . bf16(weight)); dweight = dout^T . inp and dbias = sum dout in
    fp32."""
    cases = {}
    for name, (n, i, o, has_bias, seed) in {
        "matmul_bf16_small": (37, 19, 23, True, 5),
        "matmul_bf16_row1": (1, 8, 5, True, 8),
        "matmul_bf16_nobias": (32, 48, 33, False, 6),
        "matmul_bf16_wide": (24, 96, 72, True, 7),
    }.items():
        g = gen(seed)
        inp = randn_bf16(g, n, i)
        w = randn(g, o, i, scale=1.0 / math.sqrt(i)).to(F64)
        b = randn(g, o).to(F64)
        dout = randn_bf16(g, n, o)
        dinp0 = randn_bf16(g, n, i, scale=0.5)
        wr = bf16(w)
        pre = inp @ wr.T + (bf16(b) if has_bias else 0.0)
        dx = dout @ wr
        a = {"dims": np.array([n, i, o], np.int32), "inp": f32(inp),
             "weight": f32(w), "out": f32(bf16(pre)), "dout": f32(dout),
             "dinp_start": f32(dinp0), "dinp": f32(bf16(dx)),
             "dinp_acc": f32(bf16(dinp0 + dx)),
             "dweight": f32(dout.T @ inp)}
        if has_bias:
            a["bias"] = f32(b)
            a["dbias"] = f32(dout.sum(0))
        need_bf16(name, a, ("inp", "out", "dout", "dinp_start", "dinp",
                            "dinp_acc"))
        cases[name] = a
    return cases


def matmul_gelu_bf16_cases():
    """pre as matmul_bf16_forward, out = bf16(gelu(pre)) of the rounded
    pre (the unfused pair); the weights scaled so that pre spans GELU's
    curved range."""
    cases = {}
    for name, (n, i, o, has_bias, seed) in {
        "matmul_gelu_bf16": (13, 24, 40, True, 9),
        "matmul_gelu_bf16_nobias": (6, 16, 20, False, 10),
    }.items():
        g = gen(seed)
        inp = randn_bf16(g, n, i)
        w = randn(g, o, i, scale=2.0 / math.sqrt(i)).to(F64)
        b = randn(g, o).to(F64)
        pre = bf16(inp @ bf16(w).T + (bf16(b) if has_bias else 0.0))
        out = bf16(F.gelu(pre, approximate="tanh"))
        a = {"dims": np.array([n, i, o], np.int32), "inp": f32(inp),
             "weight": f32(w), "pre": f32(pre), "out": f32(out)}
        if has_bias:
            a["bias"] = f32(b)
        need_bf16(name, a, ("inp", "pre", "out"))
        cases[name] = a
    return cases


def layernorm_bf16_cases():
    """The input (the residual stream), mean, rstd and every gradient but
    dout fp32; out bf16, dout bf16."""
    cases = {}
    for name, (n, C, offset, seed) in {
        "layernorm_bf16_small": (13, 37, 0.0, 25),
        "layernorm_bf16_c768": (4, 768, 5.0, 26),  # |mean| >> std
        "layernorm_bf16_c1": (3, 1, 0.0, 27),  # variance 0: out = bias
    }.items():
        g = gen(seed)
        inp = randn(g, n, C) + offset
        w = randn(g, C)
        b = randn(g, C)
        dout = randn_bf16(g, n, C)
        x = inp.to(F64).requires_grad_()
        wd = w.to(F64).requires_grad_()
        bd = b.to(F64).requires_grad_()
        out = F.layer_norm(x, (C,), wd, bd, eps=1e-5)
        out.backward(dout)
        xd = inp.to(F64)
        mean = xd.mean(-1)
        rstd = 1.0 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5)
        a = {"dims": np.array([n, C], np.int32), "inp": f32(inp),
             "weight": f32(w), "bias": f32(b), "out": f32(bf16(out)),
             "mean": f32(mean), "rstd": f32(rstd), "dout": f32(dout),
             "dinp": f32(x.grad), "dweight": f32(wd.grad),
             "dbias": f32(bd.grad)}
        need_bf16(name, a, ("out", "dout"))
        cases[name] = a
    return cases


def gelu_bf16_cases():
    """gelu's values as gelu_cases draws them (the active range and the
    tails), rounded to bf16; everything bf16."""
    g = gen(33)
    inp = bf16(torch.cat([randn(g, 997, scale=2.0),
                          torch.tensor([-12.0, -5.5, -3.0, 0.0, 1e-4, 3.0,
                                        5.5, 12.0, 30.0])]))
    n = inp.numel()
    dout = randn_bf16(g, n)
    dinp0 = randn_bf16(g, n, scale=0.5)
    x = inp.clone().requires_grad_()
    out = F.gelu(x, approximate="tanh")
    out.backward(dout)
    a = {"dims": np.array([n], np.int32), "inp": f32(inp),
         "out": f32(bf16(out)), "dout": f32(dout),
         "dinp_start": f32(dinp0), "dinp": f32(bf16(x.grad)),
         "dinp_acc": f32(bf16(dinp0 + x.grad))}
    need_bf16("gelu_bf16", a, ("inp", "out", "dout", "dinp_start", "dinp",
                               "dinp_acc"))
    return {"gelu_bf16": a}


def residual_bf16_cases():
    """out = a + b with a and out fp32 (the stream), b bf16 (the branch);
    backward, db = bf16(db + dout) (da += dout is fp32, as residual)."""
    g = gen(53)
    n = 101
    a_, b = randn(g, n).to(F64), randn_bf16(g, n)
    dout = randn(g, n).to(F64)
    db0 = randn_bf16(g, n, scale=0.5)
    a = {"dims": np.array([n], np.int32), "a": f32(a_), "b": f32(b),
         "out": f32(a_ + b), "dout": f32(dout), "db_start": f32(db0),
         "db": f32(bf16(dout)), "db_acc": f32(bf16(db0 + dout))}
    need_bf16("residual_bf16", a, ("b", "db_start", "db", "db_acc"))
    return {"residual_bf16": a}


def cross_entropy_bf16_cases():
    """bf16 logits (the padding and the +60 row rounded too); losses fp32
    from them; dlogits = bf16(dloss (softmax - onehot)), 0 on the padding
    and on ignored rows."""
    cases = {}
    for name, (n, V, Vp, scale, seed) in {
        # Targets -1 and -100 are both ignored rows.
        "cross_entropy_bf16_small": (6, 11, 16, 2.0, 63),
        "cross_entropy_bf16_wide": (4, 1000, 1024, 3.0, 64),
    }.items():
        g = gen(seed)
        logits = randn(g, n, Vp, scale=scale)
        targets = torch.randint(0, V, (n,), generator=g)
        targets[1] = -1
        if n > 4:
            targets[4] = -100
        targets[n - 1] = V - 1  # the last real column, next to the padding
        logits[n // 2] += 60.0  # large logits: the softmax must be stable
        logits[:, V:] = 1e4  # padding must never take probability
        logits = bf16(logits)
        valid = (targets >= 0).sum().item()
        dloss = np.float32(1.0 / valid)
        x = logits.clone().requires_grad_()
        tt = torch.where(targets < 0, torch.full_like(targets, -100), targets)
        losses = F.cross_entropy(x[:, :V], tt, reduction="none",
                                 ignore_index=-100)
        (losses * float(dloss)).sum().backward()
        a = {"dims": np.array([n, V, Vp], np.int32),
             "dloss": np.array(dloss, np.float32), "logits": f32(logits),
             "targets": i32(targets), "losses": f32(losses),
             "dlogits": f32(bf16(x.grad))}
        need_bf16(name, a, ("logits", "dlogits"))
        cases[name] = a
    return cases


def attention_bf16_ref(qkv, dout, B, T, C, NH):
    """The bf16 attention (flow/kernels.h) in float64 from bf16 qkv and
    dout: the probabilities P = exp(score - lse) from lse as the kernels
    save it (float32: a bf16 rounding of P must see the kernels' P, not a
    neighbour), rounded where they multiply (out = bf16(P).v, dv =
    bf16(P)^T.dout), the softmax's backward on P unrounded, dpre =
    scale P (dP - rowsum(P dP)) rounded where it multiplies q and k.
    Returns out, lse and dqkv before their rounding."""
    hs = C // NH
    scale = 1.0 / math.sqrt(hs)

    def heads(x):
        return x.view(B, T, NH, hs).transpose(1, 2)

    def merge(x):
        return x.transpose(1, 2).reshape(B, T, C)

    q, k, v = (heads(x) for x in qkv.split(C, dim=2))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1).to(torch.float32).to(F64)
    p = torch.exp(s - lse[..., None])
    y = merge(bf16(p) @ v)
    g = heads(dout)
    dp = g @ v.transpose(-2, -1)
    dpre = bf16(scale * p * (dp - (p * dp).sum(-1, keepdim=True)))
    dq = dpre @ k
    dk = dpre.transpose(-2, -1) @ q
    dv = bf16(p).transpose(-2, -1) @ g
    return y, lse, torch.cat([merge(dq), merge(dk), merge(dv)], dim=2)


def attention_bf16_cases():
    cases = {}
    for name, (B, T, C, NH, seed) in {
        "attention_bf16_small": (2, 5, 12, 3, 45),
        "attention_bf16_t1": (1, 1, 6, 2, 48),
        "attention_bf16_odd": (2, 17, 15, 5, 46),  # T odd, hs 3, NH odd
        "attention_bf16_hs7": (2, 11, 14, 2, 49),  # T odd, hs 7
        "attention_bf16_t64": (1, 64, 32, 2, 47),
    }.items():
        g = gen(seed)
        qkv = randn_bf16(g, B, T, 3 * C)
        dout = randn_bf16(g, B, T, C)
        dqkv0 = randn_bf16(g, B, T, 3 * C, scale=0.5)
        y, lse, dx = attention_bf16_ref(qkv, dout, B, T, C, NH)
        a = {"dims": np.array([B, T, C, NH], np.int32), "qkv": f32(qkv),
             "out": f32(bf16(y)), "lse": f32(lse), "dout": f32(dout),
             "dqkv_start": f32(dqkv0), "dqkv": f32(bf16(dx)),
             "dqkv_acc": f32(bf16(dqkv0 + dx))}
        need_bf16(name, a, ("qkv", "out", "dout", "dqkv_start", "dqkv",
                            "dqkv_acc"))
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
    for make in (matmul_cases, embedding_cases, layernorm_cases, gelu_cases,
                 attention_cases, residual_cases, cross_entropy_cases,
                 adamw_cases, grad_norm_cases, matmul_bf16_cases,
                 matmul_gelu_bf16_cases, layernorm_bf16_cases,
                 gelu_bf16_cases, residual_bf16_cases,
                 cross_entropy_bf16_cases, attention_bf16_cases):
        for name, arrays in make().items():
            total += write_fixture(os.path.join(outdir, name + ".bin"),
                                   arrays)
    print(f"wrote {total} bytes of fixtures to {outdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
