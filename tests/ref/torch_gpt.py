#!/usr/bin/python3
"""GPT-2 training in PyTorch, the reference that flow-train is checked against.

Use Debian's python3-torch (PyTorch 1.13): /usr/bin/python3, never another
python3 on PATH.  This module is imported by gpt_parity.py and by
bench/cpu-train-vs-torch.sh, and runs on its own:

    /usr/bin/python3 tests/ref/torch_gpt.py selftest
    /usr/bin/python3 tests/ref/torch_gpt.py train --ckpt DIR/step-00000000 \\
        --batches FILE --steps N [--grad-accum K] [hyperparameters]
    /usr/bin/python3 tests/ref/torch_gpt.py bench --model SPEC --batch B \\
        --seq-len T --steps N [--threads N]

What it holds, each written from flow's own definitions:

- parse_spec: flow's model specs (lib/flow/model.h): presets and
  "gpt:layers=..,heads=..,dim=..,vocab=..,seq=..[,pad=..]".
- read_checkpoint / write_checkpoint: the flow-ckpt(5) step directory
  (manifest text, rank data files); the reader checks the manifest's end
  checksum line and every shard's XXH3-64 (through libxxhash when it can be
  loaded; without it, only that the checksums are present and well formed).
- gpt_forward: GPT-2 exactly as flow builds it: x = wte[tokens] + wpe[:T];
  pre-LayerNorm blocks (eps 1e-5) with causal attention from a fused c_attn
  and GELU(tanh) MLP; logits = ln_f(x) @ wte^T over the padded vocabulary
  Vp; cross-entropy over the first V columns only.  With
  store=store_bf16, linear=bf16_linear and attend=bf16_attention (Trainer's
  bf16=True), it computes what flow's --precision bf16 does (flow/kernels.h,
  "bf16 activations"): the activations and their gradients stored in
  bf16, rounded once from the working dtype (round_bf16, float32 or
  float64), the weights rounded where a GEMM reads them, the attention's
  probabilities and dpre where they multiply.
- lr_at: flow_lr_at (lib/flow/optim.h), in double, rounded to float once.
- Trainer: K micro-batches per step, each micro-batch's mean loss scaled by
  1/K before backward; clip_grad_norm_ (clip 0 = measure only);
  torch.optim.AdamW with two groups (weight decay on the 2-D tensors only).
- read_batches / read_flow_tsv: flow-train's --dump-batches file and its
  TSV on standard output.
"""

import argparse
import ctypes
import math
import os
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

LN_EPS = 1e-5

# ---- model specs (lib/flow/model.h) -------------------------------------------

PRESETS = {
    "gpt2-124m": dict(layers=12, heads=12, dim=768),
    "gpt2-350m": dict(layers=24, heads=16, dim=1024),
    "gpt2-774m": dict(layers=36, heads=20, dim=1280),
    "gpt2-1.5b": dict(layers=48, heads=25, dim=1600),
}
SPEC_KEYS = ("layers", "heads", "dim", "vocab", "seq", "pad")


def parse_spec(spec):
    """A flow model spec -> dict(layers, heads, dim, vocab, seq, pad, vp)."""
    if spec.startswith("gpt:"):
        cfg = {}
        body = spec[4:]
    else:
        name, _, body = spec.partition(":")
        if name not in PRESETS:
            raise ValueError(f"unknown model preset '{name}'")
        cfg = dict(PRESETS[name], vocab=50257, seq=1024)
    cfg.setdefault("pad", 128)
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in SPEC_KEYS or not value.isdigit():
            raise ValueError(f"bad model spec item '{item}' in '{spec}'")
        cfg[key] = int(value)
    for key in SPEC_KEYS:
        if key not in cfg or cfg[key] <= 0:
            raise ValueError(f"model spec '{spec}' lacks a positive '{key}'")
    if cfg["dim"] % cfg["heads"]:
        raise ValueError(f"dim {cfg['dim']} is not a multiple of heads "
                         f"{cfg['heads']}")
    cfg["vp"] = -(-cfg["vocab"] // cfg["pad"]) * cfg["pad"]
    return cfg


def param_shapes(cfg):
    """(name, shape) of every parameter, in flow's order."""
    C, L = cfg["dim"], cfg["layers"]
    out = [("wte", (cfg["vp"], C)), ("wpe", (cfg["seq"], C))]
    for i in range(L):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (3 * C, C)),
                (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)),
                (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                (p + "mlp.c_fc.weight", (4 * C, C)),
                (p + "mlp.c_fc.bias", (4 * C,)),
                (p + "mlp.c_proj.weight", (C, 4 * C)),
                (p + "mlp.c_proj.bias", (C,))]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def flops_per_token(cfg, T):
    """6 N + 12 L T C, N the parameters without wpe (flow_gpt_flops_per_token)."""
    n = sum(int(np.prod(s)) for name, s in param_shapes(cfg) if name != "wpe")
    return 6.0 * n + 12.0 * cfg["layers"] * T * cfg["dim"]


def gpt2_init(cfg, seed=1337):
    """GPT-2 initialisation (lib/flow/model.h), as float32 numpy arrays."""
    g = torch.Generator()
    g.manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * cfg["layers"])
    out = {}
    for name, shape in param_shapes(cfg):
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            t = torch.ones(shape)
        elif len(shape) == 1:
            t = torch.zeros(shape)
        else:
            std = proj_std if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=g) * std
            if name == "wte":
                t[cfg["vocab"]:] = 0
        out[name] = t.numpy().astype(np.float32)
    return out


# ---- checksums ----------------------------------------------------------------

_xxh = None


def xxh3_lib():
    """libxxhash through ctypes, or None when it cannot be loaded."""
    global _xxh
    if _xxh is None:
        _xxh = False
        for name in ("libxxhash.so.0", "libxxhash.so"):
            try:
                lib = ctypes.CDLL(name)
                lib.XXH3_64bits.restype = ctypes.c_uint64
                lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
                _xxh = lib
                break
            except (OSError, AttributeError):
                pass
    return _xxh or None


def xxh3_hex(data):
    lib = xxh3_lib()
    if lib is None:
        return None
    data = bytes(data)
    return "%016x" % lib.XXH3_64bits(data, len(data))


# ---- checkpoints (flow-ckpt(5)) ----------------------------------------------

class CheckpointError(Exception):
    pass


DTYPES = {"f32": "<f4", "f64": "<f8", "i32": "<i4", "u16": "<u2",
          "u32": "<u4", "i64": "<i8"}
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _parse_shape(text, where):
    m = re.fullmatch(r"\(([0-9,]*)\)", text)
    if not m:
        raise CheckpointError(f"{where}: bad shape '{text}'")
    return tuple(int(x) for x in m.group(1).split(",") if x != "")


def _parse_box(text, ndim, where):
    box = []
    for part in (text.split(",") if text not in ("", "-") else []):
        m = re.fullmatch(r"(\d+):(\d+)", part)
        if not m or int(m.group(2)) < int(m.group(1)):
            raise CheckpointError(f"{where}: bad box '{text}'")
        box.append((int(m.group(1)), int(m.group(2))))
    if len(box) != ndim:
        raise CheckpointError(f"{where}: box '{text}' has {len(box)} "
                              f"dimensions, the tensor {ndim}")
    return box


def read_manifest(step_dir, verify=True):
    """Parse step_dir/manifest -> dict(step, state, tensors, checksum_verified).

    tensors: {name: dict(dtype, shape, mesh, sbp, shards=[dict(rank, box,
    file, offset, length, xxh3)])}, in manifest order.  The last line must
    be "end XXH3" (16 hex digits); with libxxhash it must equal the XXH3-64
    of every byte before that line."""
    path = os.path.join(step_dir, "manifest")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"{step_dir} is not a committed checkpoint: {e}")
    if not raw.endswith(b"\n"):
        raise CheckpointError(f"{path}: no newline at the end")
    lines = raw[:-1].split(b"\n")
    last_start = len(raw) - len(lines[-1]) - 1
    out = {"step": None, "state": {}, "tensors": {},
           "checksum_verified": False}
    cur = None
    for lineno, bline in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        try:
            line = bline.decode("ascii")
        except UnicodeDecodeError:
            raise CheckpointError(f"{where}: not ASCII")
        if lineno == 1:
            if line != "flow-checkpoint 1":
                raise CheckpointError(f"{where}: expected 'flow-checkpoint 1',"
                                      f" got '{line}'")
            continue
        if line == "" or line.startswith("#"):
            continue
        f = line.split()
        key = f[0]
        if lineno == len(lines):
            if key != "end" or len(f) != 2 or not HEX16.match(f[1]):
                raise CheckpointError(f"{where}: the last line must be "
                                      f"'end XXH3', got '{line}'")
            if verify:
                want = xxh3_hex(raw[:last_start])
                if want is not None:
                    if want != f[1]:
                        raise CheckpointError(f"{where}: manifest checksum "
                                              f"{f[1]}, computed {want}")
                    out["checksum_verified"] = True
            break
        if key == "step" and len(f) == 2 and f[1].isdigit():
            out["step"] = int(f[1])
        elif key == "state" and len(f) >= 2:
            value = line.split(None, 2)[2] if len(f) > 2 else ""
            out["state"][f[1]] = value
        elif key == "tensor" and len(f) == 6:
            if f[2] not in DTYPES:
                raise CheckpointError(f"{where}: unknown dtype '{f[2]}'")
            if f[1] in out["tensors"]:
                raise CheckpointError(f"{where}: tensor '{f[1]}' twice")
            cur = {"name": f[1], "dtype": f[2],
                   "shape": _parse_shape(f[3], where), "mesh": f[4],
                   "sbp": f[5], "shards": []}
            out["tensors"][f[1]] = cur
        elif key == "shard" and len(f) == 8:
            if cur is None or f[1] != cur["name"]:
                raise CheckpointError(f"{where}: shard of '{f[1]}' outside "
                                      f"its tensor")
            if not HEX16.match(f[7]) or "/" in f[4]:
                raise CheckpointError(f"{where}: bad shard line '{line}'")
            cur["shards"].append({
                "rank": int(f[2]),
                "box": _parse_box(f[3], len(cur["shape"]), where),
                "file": f[4], "offset": int(f[5]), "length": int(f[6]),
                "xxh3": f[7]})
        else:
            raise CheckpointError(f"{where}: unexpected line '{line}'")
    else:
        raise CheckpointError(f"{path}: no 'end XXH3' line")
    if out["step"] is None:
        raise CheckpointError(f"{path}: no 'step' line")
    return out


def read_checkpoint(step_dir, verify=True, names=None):
    """-> (manifest dict, {name: numpy array}) for every tensor (or names)."""
    man = read_manifest(step_dir, verify)
    arrays = {}
    for name, t in man["tensors"].items():
        if names is not None and name not in names:
            continue
        dt = np.dtype(DTYPES[t["dtype"]])
        arr = np.zeros(t["shape"], dtype=dt)
        covered = np.zeros(t["shape"], dtype=bool)
        for s in t["shards"]:
            ext = tuple(b - a for a, b in s["box"])
            n = int(np.prod(ext)) if ext else 1
            if s["length"] != n * dt.itemsize:
                raise CheckpointError(f"{step_dir}: shard of {name}: length "
                                      f"{s['length']}, box needs "
                                      f"{n * dt.itemsize}")
            fpath = os.path.join(step_dir, s["file"])
            with open(fpath, "rb") as f:
                f.seek(s["offset"])
                data = f.read(s["length"])
            if len(data) != s["length"]:
                raise CheckpointError(f"{fpath}: short read of {name} at "
                                      f"{s['offset']}")
            if verify:
                got = xxh3_hex(data)
                if got is not None and got != s["xxh3"]:
                    raise CheckpointError(f"{fpath}: checksum of {name} at "
                                          f"offset {s['offset']}: stored "
                                          f"{s['xxh3']}, computed {got}")
            sl = tuple(slice(a, b) for a, b in s["box"])
            arr[sl] = np.frombuffer(data, dtype=dt).reshape(ext)
            covered[sl] = True
        if not covered.all():
            raise CheckpointError(f"{step_dir}: the shards of {name} do not "
                                  f"cover its shape {t['shape']}")
        arrays[name] = arr.astype(dt.newbyteorder("="), copy=False)
    return man, arrays


def write_checkpoint(step_dir, step, arrays, state=()):
    """Write a single-rank flow-ckpt(5) step directory (float32 / int32
    arrays, one whole-tensor shard each).  Used by the self-test and to make
    synthetic inputs."""
    os.makedirs(step_dir, exist_ok=True)
    lines = ["flow-checkpoint 1", f"step {step}"]
    lines += [f"state {k} {v}" for k, v in state]
    offset = 0
    with open(os.path.join(step_dir, "rank-00000.bin"), "wb") as f:
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            code = {"float32": "f32", "int32": "i32"}[arr.dtype.name]
            data = arr.astype(DTYPES[code]).tobytes()
            shape = "(" + ",".join(str(d) for d in arr.shape) + ")"
            box = ",".join(f"0:{d}" for d in arr.shape)
            lines.append(f"tensor {name} {code} {shape} 1 (B)")
            lines.append(f"shard {name} 0 {box} rank-00000.bin {offset} "
                         f"{len(data)} {xxh3_hex(data) or '0' * 16}")
            f.write(data)
            offset += len(data)
    body = ("\n".join(lines) + "\n").encode()
    with open(os.path.join(step_dir, "manifest"), "wb") as f:
        f.write(body + f"end {xxh3_hex(body) or '0' * 16}\n".encode())


# ---- flow-train's outputs ---------------------------------------------------

def read_batches(path, steps, accum, B, T):
    """--dump-batches file -> int64 array [steps, accum, 2, B, T]
    (index 0 the inputs, 1 the targets)."""
    per_step = accum * 2 * B * T
    data = np.fromfile(path, dtype="<i4")
    if data.size < steps * per_step:
        raise ValueError(f"{path}: {data.size} int32 values, {steps} steps "
                         f"of {accum}x2x{B}x{T} need {steps * per_step}")
    if data.size % per_step:
        raise ValueError(f"{path}: {data.size} int32 values is not a whole "
                         f"number of steps of {per_step}")
    return data[:steps * per_step].astype(np.int64).reshape(
        steps, accum, 2, B, T)


def read_flow_tsv(text):
    """flow-train's standard output -> (preamble lines, list of row dicts).
    Numeric fields become floats ('-' stays a string), step an int."""
    preamble, rows, header = [], [], None
    for line in text.splitlines():
        if line.startswith("#"):
            preamble.append(line)
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if header is None:
            header = fields
            continue
        if len(fields) != len(header):
            raise ValueError(f"TSV row with {len(fields)} fields, header has "
                             f"{len(header)}: {line!r}")
        row = {}
        for k, v in zip(header, fields):
            if k == "step":
                row[k] = int(v)
            elif k == "phase":
                row[k] = v
            else:
                try:
                    row[k] = float(v)
                except ValueError:
                    row[k] = v
        rows.append(row)
    if header is None:
        raise ValueError("no TSV header in flow-train's output")
    return preamble, rows


# ---- the model ---------------------------------------------------------------

# The largest finite bfloat16, (2 - 2^-7) 2^127, and the power of two that
# a rounding carries past it to infinity.
BF16_MAX = (2.0 - 2.0 ** -7) * 2.0 ** 127
BF16_OVERFLOW = 2.0 ** 128


def round_bf16(t):
    """t rounded once to the nearest bfloat16, ties to even, in t's own
    dtype (float32 or float64): flow_round_bf16 (flow/tensor.h) for float32,
    and the same rounding of the exact float64 value for float64.

    PyTorch's own float64 -> bfloat16 conversion goes through float32 and
    so rounds twice: 1 + 2^-8 + 2^-40 becomes 1 + 2^-8 (a tie) and then 1,
    where the nearest bf16 is 1 + 2^-7.  Here a float64 is rounded in its
    own arithmetic instead: t / q, with q the spacing of the bf16 values
    around t (2^(e-8) for 2^(e-1) <= |t| < 2^e, 8 significant bits; 2^-133
    among the subnormals, below 2^-126), is exact, torch.round rounds it to
    an integer with ties to even, and times q is exact again.  Magnitudes
    that round to 2^128 or beyond become infinities, NaN stays NaN."""
    if t.dtype == torch.float32:
        return t.to(torch.bfloat16).to(torch.float32)
    if t.dtype != torch.float64:
        raise TypeError(f"round_bf16: float32 or float64, not {t.dtype}")
    _, e = torch.frexp(t)
    e = torch.clamp(e, min=-125).to(torch.float64)
    q = torch.pow(torch.full_like(t, 2.0), e - 8.0)
    r = torch.round(t / q) * q
    return torch.where(r.abs() >= BF16_OVERFLOW, r * math.inf, r)


def _bf16_oracle(x):
    """x (a Python float) rounded to the nearest bfloat16 by search over
    the table of every finite bf16 value, ties to the even bit pattern: a
    check of round_bf16 that shares none of its arithmetic.  Exact: the
    comparisons are of Fractions."""
    from bisect import bisect_left
    from fractions import Fraction
    global _bf16_table
    if "_bf16_table" not in globals():
        import struct
        vals = []
        for h in range(0x7F80):  # +0 .. the largest finite, in order
            f = struct.unpack("<f", struct.pack("<I", h << 16))[0]
            vals.append((Fraction(f), h))
        _bf16_table = vals
    if math.isnan(x):
        return x
    a = Fraction(abs(x)) if math.isfinite(x) else None
    top = _bf16_table[-1][0]
    if a is None or a >= top + (Fraction(BF16_OVERFLOW) - top) / 2:
        return math.copysign(math.inf, x)
    i = bisect_left(_bf16_table, (a, -1))
    if a >= top:
        r = top
    elif _bf16_table[i][0] == a:
        r = a
    else:
        (lo, hlo), (hi, _) = _bf16_table[i - 1], _bf16_table[i]
        if a - lo != hi - a:
            r = lo if a - lo < hi - a else hi
        else:
            r = lo if hlo % 2 == 0 else hi
    return math.copysign(float(r), x)


class _StoreBf16(torch.autograd.Function):
    """The identity, with its value and its gradient each rounded to
    bfloat16 (round_bf16): a tensor flow stores in bf16 under --precision
    bf16.  Its producer computes in the working dtype and rounds once when
    it stores (forward); its gradient, summed in the working dtype by the
    consumer's backward, is stored rounded too (each bf16 activation has
    one consumer, so its gradient is rounded once)."""

    @staticmethod
    def forward(ctx, x):
        return round_bf16(x)

    @staticmethod
    def backward(ctx, g):
        return round_bf16(g)


def store_bf16(x):
    return _StoreBf16.apply(x)


class _Bf16Weight(torch.autograd.Function):
    """A weight or bias as a bf16 GEMM reads it: rounded to bfloat16 for
    the product, its gradient passed through unrounded (flow keeps weights
    and their gradients in fp32, the gradient summed in fp32 from the bf16
    operands)."""

    @staticmethod
    def forward(ctx, w):
        return round_bf16(w)

    @staticmethod
    def backward(ctx, g):
        return g


def bf16_linear(x, w, b=None):
    """flow's bf16 matmul (flow/kernels.h): x is a bf16 activation
    (store_bf16 by its producer), the weight and the bias rounded as
    autocast rounds them, the products summed in x's dtype; backward,
    dx = dout . bf16(w) (its caller's store_bf16 rounds it), and dw, db
    summed unrounded.  The output is rounded by the store_bf16 around it."""
    return F.linear(x, _Bf16Weight.apply(w),
                    None if b is None else _Bf16Weight.apply(b))


def causal_attention(q, k, v):
    """Causal attention over q, k, v [B,NH,T,hs], written out."""
    T, hs = q.shape[-2], q.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return att @ v


def sdpa_attention(q, k, v):
    """Causal attention through PyTorch 2's fused kernels."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Bf16Attention(torch.autograd.Function):
    """causal_attention with flow's bf16 products (flow/kernels.h,
    attention): q, k, v (slices of the bf16 qkv) and the output's gradient
    are bf16 already (store_bf16 around qkv and the output); the
    probabilities P are rounded where they multiply, out = bf16(P).v and
    dv = bf16(P)^T.dout, and dpre = scale P (dP - rowsum(P dP)) where it
    multiplies, dq = bf16(dpre).k and dk = bf16(dpre)^T.q; the softmax and
    its backward use P unrounded; every sum in the inputs' dtype."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, hs = q.shape[-2], q.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        p = s.masked_fill(mask, float("-inf")).softmax(dim=-1)
        ctx.save_for_backward(q, k, v, p)
        return round_bf16(p) @ v

    @staticmethod
    def backward(ctx, g):
        q, k, v, p = ctx.saved_tensors
        dp = g @ v.transpose(-2, -1)
        scale = 1.0 / math.sqrt(q.shape[-1])
        dpre = round_bf16(scale * (p * (dp - (p * dp).sum(-1, True))))
        return (dpre @ k, dpre.transpose(-2, -1) @ q,
                round_bf16(p).transpose(-2, -1) @ g)


def bf16_attention(q, k, v):
    return _Bf16Attention.apply(q, k, v)


def _identity(x):
    return x


def gpt_forward(p, cfg, idx, targets=None, linear=F.linear,
                attend=causal_attention, store=_identity):
    """Forward of GPT-2 on idx [B,T] with parameters p {name: tensor}, its
    projections through linear (F.linear, or bf16_linear) and its
    attention through attend (causal_attention, the references';
    bf16_attention; or sdpa_attention, the benchmarks' PyTorch at its
    best), and store applied to every activation flow keeps in its
    activation dtype (flow/ops.h, "Mixed precision"): the outputs of the
    layernorms, projections, GELU and attention, and the logits; the
    identity, or store_bf16 for --precision bf16.  The residual stream
    (the embedding's and adds' outputs) never passes through it.  Returns
    (logits [B,T,Vp], mean cross-entropy over the first V columns or
    None)."""
    B, T = idx.shape
    C, NH, V = cfg["dim"], cfg["heads"], cfg["vocab"]
    hs = C // NH
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
    for i in range(cfg["layers"]):
        h = f"h.{i}."
        a = store(F.layer_norm(x, (C,), p[h + "ln_1.weight"],
                               p[h + "ln_1.bias"], LN_EPS))
        qkv = store(linear(a, p[h + "attn.c_attn.weight"],
                           p[h + "attn.c_attn.bias"]))
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        y = store(attend(q, k, v))
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + store(linear(y, p[h + "attn.c_proj.weight"],
                             p[h + "attn.c_proj.bias"]))
        m = store(F.layer_norm(x, (C,), p[h + "ln_2.weight"],
                               p[h + "ln_2.bias"], LN_EPS))
        m = store(linear(m, p[h + "mlp.c_fc.weight"],
                         p[h + "mlp.c_fc.bias"]))
        m = store(F.gelu(m, approximate="tanh"))
        x = x + store(linear(m, p[h + "mlp.c_proj.weight"],
                             p[h + "mlp.c_proj.bias"]))
    x = store(F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"],
                           LN_EPS))
    logits = store(linear(x, p["wte"]))
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits[..., :V].reshape(-1, V),
                               targets.reshape(-1))
    return logits, loss


# ---- the optimizer ---------------------------------------------------------

def lr_at(lr, min_lr, warmup, total, step):
    """flow_lr_at: linear warmup, then cosine to min_lr at step total (and
    min_lr after it); in double, rounded to float32 once.  Returns a numpy
    float32."""
    if warmup > 0 and step <= warmup:
        return np.float32(lr * step / warmup)
    if total <= warmup:
        return np.float32(lr)
    frac = min((step - warmup) / (total - warmup), 1.0)
    return np.float32(min_lr + (lr - min_lr) *
                      (1.0 + math.cos(math.pi * frac)) / 2.0)


class Hyper:
    """flow-train's optimizer options with its defaults."""

    def __init__(self, lr=6e-4, min_lr=None, warmup=0, weight_decay=0.1,
                 beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0, steps=1,
                 grad_accum=1):
        self.lr, self.warmup, self.steps = lr, warmup, steps
        self.min_lr = lr / 10 if min_lr is None else min_lr
        self.weight_decay, self.beta1, self.beta2 = weight_decay, beta1, beta2
        self.eps, self.clip, self.grad_accum = eps, clip, grad_accum

    def flow_args(self):
        """The flow-train options that set these values."""
        return ["--lr", repr(self.lr), "--min-lr", repr(self.min_lr),
                "--warmup", str(self.warmup),
                "--weight-decay", repr(self.weight_decay),
                "--beta1", repr(self.beta1), "--beta2", repr(self.beta2),
                "--eps", repr(self.eps), "--clip", repr(self.clip),
                "--steps", str(self.steps),
                "--grad-accum", str(self.grad_accum)]

    def lr_at(self, step):
        return lr_at(self.lr, self.min_lr, self.warmup, self.steps, step)


def grad_norm(params):
    """The global L2 norm as clip_grad_norm_ computes it, without clipping."""
    norms = [torch.linalg.vector_norm(q.grad.detach(), 2) for q in params]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


class Trainer:
    """The training loop of flow-train in PyTorch, from given weights."""

    def __init__(self, cfg, weights, hp, dtype=torch.float32, device="cpu",
                 autocast=None, compile_model=False, bf16=False,
                 fast=False):
        """autocast: None, or a dtype (torch.bfloat16) the forward pass
        runs in under torch.autocast, weights staying dtype;
        compile_model: the forward through torch.compile; bf16: flow's
        --precision bf16 emulated in dtype (float32, or float64 for the
        error split): the activations and their gradients stored in bf16
        (store_bf16), every projection through bf16_linear and the
        attention through bf16_attention;
        fast: PyTorch's fastest equivalents for a benchmark, the fused
        attention (sdpa) and fused AdamW (on a GPU), not the reference's
        arithmetic."""
        self.cfg, self.hp = cfg, hp
        self.device, self.autocast = torch.device(device), autocast
        linear = bf16_linear if bf16 else F.linear
        attend = (sdpa_attention if fast else
                  bf16_attention if bf16 else causal_attention)
        store = store_bf16 if bf16 else _identity

        def forward(p, cfg, idx, targets=None):
            return gpt_forward(p, cfg, idx, targets, linear=linear,
                               attend=attend, store=store)
        self.forward = torch.compile(forward) if compile_model else forward
        self.names = [n for n, _ in param_shapes(cfg)]
        self.params = {}
        for name, shape in param_shapes(cfg):
            if name not in weights:
                raise ValueError(f"no weights for parameter '{name}'")
            w = np.asarray(weights[name])
            if tuple(w.shape) != shape:
                raise ValueError(f"parameter '{name}' has shape "
                                 f"{tuple(w.shape)}, the model {shape}")
            self.params[name] = torch.tensor(w, dtype=dtype,
                                             device=self.device,
                                             requires_grad=True)
        plist = [self.params[n] for n in self.names]
        decay = [q for q in plist if q.dim() >= 2]
        nodecay = [q for q in plist if q.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay},
             {"params": nodecay, "weight_decay": 0.0}],
            lr=float(hp.lr), betas=(hp.beta1, hp.beta2), eps=hp.eps,
            **({"fused": True} if fast and self.device.type == "cuda"
               else {"foreach": False}))
        self.step_no = 0

    def plist(self):
        return [self.params[n] for n in self.names]

    def forward_backward(self, micro_batches):
        """micro_batches: [(inputs [B,T], targets [B,T])...] -> the mean of
        the micro-batch losses (float); gradients accumulate in .grad."""
        K = len(micro_batches)
        total = 0.0
        for inp, tgt in micro_batches:
            inp = torch.as_tensor(inp).to(self.device)
            tgt = torch.as_tensor(tgt).to(self.device)
            if self.autocast is not None:
                with torch.autocast(self.device.type, dtype=self.autocast):
                    _, loss = self.forward(self.params, self.cfg, inp, tgt)
            else:
                _, loss = self.forward(self.params, self.cfg, inp, tgt)
            (loss / K).backward()
            total += loss.item()
        return total / K

    def step(self, micro_batches, on_grads=None):
        """One training step; on_grads(self) is called after backward,
        before clipping.  Returns dict(step, loss, lr, grad_norm, clipped)."""
        self.step_no += 1
        s = self.step_no
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_backward(micro_batches)
        for n in self.names:
            if self.params[n].grad is None:
                self.params[n].grad = torch.zeros_like(self.params[n])
        if on_grads is not None:
            on_grads(self)
        r = self.update(s)
        r["loss"] = loss
        return r

    def update(self, s):
        """Clip the gradients in .grad and take AdamW step s (1-based) with
        lr_at(s).  Returns dict(step, lr, grad_norm, clipped)."""
        plist = self.plist()
        if self.hp.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(plist, self.hp.clip)
        else:
            norm = grad_norm(plist)
        norm = float(norm)
        lr = self.hp.lr_at(s)
        for g in self.opt.param_groups:
            g["lr"] = float(lr)
        self.opt.step()
        return {"step": s, "lr": lr, "grad_norm": norm,
                "clipped": self.hp.clip > 0 and norm > self.hp.clip}

    def set_grads(self, grads):
        """Use the arrays grads {name: array} as the gradients."""
        for n in self.names:
            self.params[n].grad = torch.tensor(np.asarray(grads[n]),
                                               dtype=self.params[n].dtype)

    def weights(self):
        return {n: self.params[n].detach().cpu().numpy() for n in self.names}

    def moments(self):
        """{'adamw.m/NAME': m, 'adamw.v/NAME': v} after at least one step."""
        out = {}
        for n in self.names:
            st = self.opt.state.get(self.params[n], {})
            if "exp_avg" in st:
                out["adamw.m/" + n] = st["exp_avg"].numpy()
                out["adamw.v/" + n] = st["exp_avg_sq"].numpy()
        return out


def set_deterministic(threads):
    torch.set_num_threads(max(1, threads))
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


# ---- commands ------------------------------------------------------------------

def add_hyper_args(ap):
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--steps", type=int, required=True)


def hyper_from_args(a):
    return Hyper(lr=a.lr, min_lr=a.min_lr, warmup=a.warmup,
                 weight_decay=a.weight_decay, beta1=a.beta1, beta2=a.beta2,
                 eps=a.eps, clip=a.clip, steps=a.steps,
                 grad_accum=a.grad_accum)


def cmd_train(a):
    """Train from a flow checkpoint on flow's dumped batches; print TSV."""
    set_deterministic(a.threads)
    man, weights = read_checkpoint(a.ckpt)
    cfg = parse_spec(a.model or man["state"].get("model", ""))
    hp = hyper_from_args(a)
    batches = read_batches(a.batches, a.steps, a.grad_accum, a.batch,
                           a.seq_len)
    tr = Trainer(cfg, weights, hp)
    print("step\tphase\tloss\tlr\tgrad_norm")
    for s in range(a.steps):
        r = tr.step([(mb[0], mb[1]) for mb in batches[s]])
        print(f"{r['step']}\ttrain\t{r['loss']:.9g}\t{r['lr']:.9g}\t"
              f"{r['grad_norm']:.9g}")
    return 0


def cmd_bench(a):
    """Time training steps of a freshly initialised model on random tokens:
    one line per step 'step<TAB>ms', then '# median_ms X' over the steps
    after --warmup-steps."""
    cuda = a.device == "cuda"
    if cuda:
        # As flow's fp32: true fp32, no TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_num_threads(max(1, a.threads))
        torch.manual_seed(0)
    else:
        set_deterministic(a.threads)
    cfg = parse_spec(a.model)
    hp = Hyper(steps=a.steps + a.warmup_steps, grad_accum=1)
    t0 = time.perf_counter()
    # On a GPU, PyTorch at its best: fused attention and AdamW (PyTorch 2).
    fast = cuda and hasattr(F, "scaled_dot_product_attention")
    tr = Trainer(cfg, gpt2_init(cfg, a.seed), hp, device=a.device,
                 autocast=torch.bfloat16 if a.precision == "bf16" else None,
                 compile_model=a.compile, fast=fast)
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"model {a.model}, B {a.batch}, T {a.seq_len}, device {a.device}, "
          f"precision {a.precision}, "
          f"{'torch.compile' if a.compile else 'eager'}, "
          f"{'sdpa attention, fused AdamW' if fast else 'reference attention and AdamW'}, init "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms", flush=True)
    g = torch.Generator()
    g.manual_seed(a.seed)
    times = []
    print("step\tms", flush=True)
    for s in range(1, a.steps + a.warmup_steps + 1):
        toks = torch.randint(0, cfg["vocab"], (a.batch, a.seq_len + 1),
                             generator=g)
        t0 = time.perf_counter()
        tr.step([(toks[:, :-1], toks[:, 1:])])
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        print(f"{s}\t{ms:.3f}", flush=True)
        if s > a.warmup_steps:
            times.append(ms)
    print(f"# median_ms {float(np.median(times)):.3f}")
    return 0


def cmd_selftest(a):
    """Checks of this module on its own (no flow-train needed)."""
    import tempfile
    set_deterministic(a.threads)
    fails = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            fails.append(what)

    # Specs.
    c = parse_spec("gpt2-124m")
    check((c["layers"], c["dim"], c["vocab"], c["vp"], c["seq"]) ==
          (12, 768, 50257, 50304, 1024), "gpt2-124m preset, Vp 50304")
    n124 = sum(int(np.prod(s)) for _, s in param_shapes(c))
    check(n124 == 124475904, f"gpt2-124m has {n124} parameters with the "
          "padded wte rows (llm.c: 124475904)")
    c = parse_spec("gpt2-124m:seq=256")
    check(c["seq"] == 256, "preset override")
    cfg = parse_spec("gpt:layers=2,heads=2,dim=64,vocab=200,seq=64")
    check(cfg["vp"] == 256, "vocab 200 pads to 256")

    # LR schedule.
    hp = Hyper(lr=1e-3, warmup=4, steps=20)
    lrs = [hp.lr_at(s) for s in range(1, 21)]
    check(lrs[0] == np.float32(2.5e-4) and lrs[3] == np.float32(1e-3),
          "warmup is linear and reaches lr")
    check(lrs[-1] == np.float32(1e-4), "cosine reaches min_lr at the last "
          "step")
    check(all(x >= y for x, y in zip(lrs[3:], lrs[4:])), "cosine decreases")
    check(Hyper(lr=3e-4, min_lr=3e-4, steps=9).lr_at(5) == np.float32(3e-4),
          "warmup 0 and min_lr == lr give a constant rate")

    # Loss at initialisation is about ln(V); padding is masked.
    w = gpt2_init(cfg, 1)
    tr = Trainer(cfg, w, Hyper(steps=3, grad_accum=2))
    g = torch.Generator()
    g.manual_seed(5)
    toks = torch.randint(0, cfg["vocab"], (2, 4, 33), generator=g)
    mbs = [(t[:, :-1], t[:, 1:]) for t in toks]
    with torch.no_grad():
        logits, loss0 = gpt_forward(tr.params, cfg, *mbs[0])
    check(abs(loss0.item() - math.log(cfg["vocab"])) < 0.05,
          f"loss at init {loss0.item():.4f} ~ ln(V) = "
          f"{math.log(cfg['vocab']):.4f}")
    check(logits.shape[-1] == 256, "logits span Vp columns")
    # Padding columns must not change the loss: set them to large values.
    p2 = dict(tr.params)
    wte = tr.params["wte"].detach().clone()
    wte[cfg["vocab"]:] = 5.0
    p2["wte"] = wte
    with torch.no_grad():
        _, loss_pad = gpt_forward(p2, cfg, *mbs[0])
    check(loss_pad.item() == loss0.item(), "padded columns are masked out "
          "of the loss")

    # The model against an independent float64 formulation (explicit
    # layernorm, softmax and log-sum-exp).
    def manual_loss(p, idx, tgt):
        d = {k: v.double() for k, v in p.items()}
        B, T = idx.shape
        C, NH, V = cfg["dim"], cfg["heads"], cfg["vocab"]
        hs = C // NH

        def ln(x, wgt, b):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + 1e-5) * wgt + b

        x = d["wte"][idx] + d["wpe"][:T]
        for i in range(cfg["layers"]):
            h = f"h.{i}."
            a_ = ln(x, d[h + "ln_1.weight"], d[h + "ln_1.bias"])
            qkv = a_ @ d[h + "attn.c_attn.weight"].T + d[h + "attn.c_attn.bias"]
            y = torch.zeros(B, T, C, dtype=torch.float64)
            for hd in range(NH):
                q = qkv[..., hd * hs:(hd + 1) * hs]
                k = qkv[..., C + hd * hs:C + (hd + 1) * hs]
                v = qkv[..., 2 * C + hd * hs:2 * C + (hd + 1) * hs]
                s_ = q @ k.transpose(1, 2) / math.sqrt(hs)
                s_ = s_ + torch.triu(torch.full((T, T), -1e30,
                                                dtype=torch.float64), 1)
                e = torch.exp(s_ - s_.max(-1, keepdim=True).values)
                y[..., hd * hs:(hd + 1) * hs] = (e / e.sum(-1, keepdim=True)) @ v
            x = x + y @ d[h + "attn.c_proj.weight"].T + d[h + "attn.c_proj.bias"]
            m = ln(x, d[h + "ln_2.weight"], d[h + "ln_2.bias"])
            m = m @ d[h + "mlp.c_fc.weight"].T + d[h + "mlp.c_fc.bias"]
            m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) *
                                          (m + 0.044715 * m ** 3)))
            x = x + m @ d[h + "mlp.c_proj.weight"].T + d[h + "mlp.c_proj.bias"]
        x = ln(x, d["ln_f.weight"], d["ln_f.bias"])
        z = (x @ d["wte"].T)[..., :V]
        lse = torch.logsumexp(z, -1)
        zt = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        return (lse - zt).mean()

    # Random (not init-like) weights so every term matters.
    g2 = torch.Generator()
    g2.manual_seed(9)
    wr = {n: (torch.randn(s, generator=g2) * 0.3).numpy()
          for n, s in param_shapes(cfg)}
    trr = Trainer(cfg, wr, Hyper(steps=1))
    with torch.no_grad():
        _, l32 = gpt_forward(trr.params, cfg, *mbs[0])
        l64 = manual_loss(trr.params, *mbs[0])
    check(abs(l32.item() - l64.item()) <= 1e-5 * abs(l64.item()),
          f"loss {l32.item():.7f} equals an independent float64 formulation "
          f"{l64.item():.7f}")

    # One step: gradient accumulation, clipping, AdamW with two groups,
    # against hand-written formulas in float64.
    hp = Hyper(lr=1e-2, warmup=0, steps=3, grad_accum=2, clip=0.05,
               weight_decay=0.1)
    tr32 = Trainer(cfg, w, hp)
    w64 = {n: torch.tensor(w[n], dtype=torch.float64, requires_grad=True)
           for n in tr32.names}
    full = torch.cat([toks[0], toks[1]], 0)
    grads = {}

    def grab(t):
        for n in t.names:
            grads[n] = t.params[n].grad.clone()
    r = tr32.step(mbs, on_grads=grab)
    # The gradient of the mean of two micro-batch means equals that of the
    # mean over their union (equal sizes).
    _, l64 = gpt_forward(w64, cfg, full[:, :-1], full[:, 1:])
    l64.backward()
    worst = max(float((grads[n].double() - w64[n].grad).abs().max() /
                      (w64[n].grad.abs().max() + 1e-30)) for n in tr32.names)
    check(worst < 1e-4, f"accumulated float32 gradients match float64 over "
          f"the whole batch (worst relative to the tensor max: {worst:.2e})")
    check(abs(r["loss"] - l64.item()) < 1e-5 * l64.item(), "step loss is "
          "the mean of the micro-batch losses")
    norm64 = math.sqrt(sum(float((w64[n].grad ** 2).sum())
                           for n in tr32.names))
    check(abs(r["grad_norm"] - norm64) < 1e-5 * norm64, f"grad_norm "
          f"{r['grad_norm']:.6g} = float64 {norm64:.6g}")
    check(r["clipped"], "clip 0.05 clips")
    coef = min(1.0, hp.clip / (norm64 + 1e-6))
    lr = float(hp.lr_at(1))
    worst = 0.0
    for n in tr32.names:
        p0 = torch.tensor(w[n], dtype=torch.float64)
        gr = w64[n].grad * coef
        m = (1 - hp.beta1) * gr
        v = (1 - hp.beta2) * gr * gr
        mhat = m / (1 - hp.beta1)
        vhat = v / (1 - hp.beta2)
        wd = hp.weight_decay if p0.dim() >= 2 else 0.0
        p1 = p0 * (1 - lr * wd) - lr * mhat / (vhat.sqrt() + hp.eps)
        got = tr32.params[n].detach().double()
        # Elements whose gradient is ~0 can move by up to lr from float32
        # noise in Adam's m/sqrt(v): compare relative to lr.
        worst = max(worst, float((got - p1).abs().max()) / lr)
    check(worst < 0.05, f"AdamW step with two groups matches the formula "
          f"(worst |dw| / lr = {worst:.2e})")
    nodecay = [n for n in tr32.names if tr32.params[n].dim() < 2]
    check(all(n.endswith(("bias", "ln_1.weight", "ln_2.weight",
                          "ln_f.weight")) for n in nodecay) and
          len(nodecay) == 2 + 8 * cfg["layers"],
          "biases and layernorm parameters are the no-decay group")
    mom = tr32.moments()
    check(len(mom) == 2 * len(tr32.names), "moments for every parameter")

    # bf16 rounding: round_bf16 against a table search in exact
    # arithmetic, on ties of both parities, values just off a tie (where
    # float64 -> float32 -> bf16 rounds the wrong way), subnormals,
    # overflow, and random values of every magnitude.
    f64 = torch.float64
    hand = [0.0, -0.0, 1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8),
            1 + 2 ** -8 + 2 ** -40, 1 + 2 ** -8 - 2 ** -40,
            1 + 3 * 2 ** -8 - 2 ** -40, 2.0 ** -126, 2.0 ** -133,
            2.0 ** -134, 3 * 2.0 ** -135, 2.0 ** -134 + 2.0 ** -160,
            1.5 * 2.0 ** -130 + 2.0 ** -150, BF16_MAX,
            BF16_MAX + 2.0 ** 119, BF16_MAX + 2.0 ** 119 - 2.0 ** 90,
            2.0 ** 130, -3e38, 1e-45, math.inf, -math.inf]
    gr = torch.Generator()
    gr.manual_seed(3)
    rnd = (torch.randn(4000, generator=gr, dtype=f64) *
           torch.pow(2.0, torch.randint(-140, 128, (4000,), generator=gr)
                     .to(f64)))
    # Midpoints between random normal bf16 neighbours, exactly and 2^-30
    # of them off (float32 rounds those back onto the midpoint).
    mids = [b + math.copysign(2.0 ** (math.frexp(b)[1] - 9), b)
            for b in round_bf16(rnd[:1000]).tolist()
            if 2.0 ** -126 <= abs(b) < 2.0 ** 127]
    xs = hand + rnd.tolist() + mids + [
        m * (1 + s * 2.0 ** -30) for m in mids[:200] for s in (1, -1)]
    got = round_bf16(torch.tensor(xs, dtype=f64)).tolist()
    bad = [(x, g) for x, g in zip(xs, got)
           if not (g == _bf16_oracle(x) and
                   math.copysign(1, g) == math.copysign(1, _bf16_oracle(x)))]
    check(not bad, f"round_bf16 of {len(xs)} float64 values equals the "
          f"nearest bf16 by table search" + (f" (first miss: {bad[0]})"
                                             if bad else ""))
    x32 = torch.tensor(xs, dtype=f64).to(torch.float32)
    got32 = round_bf16(x32).tolist()
    check(all(g == _bf16_oracle(x) for x, g in zip(x32.tolist(), got32)),
          "round_bf16 of float32 values equals the nearest bf16")
    twice = torch.tensor(xs, dtype=f64).to(torch.float32).to(
        torch.bfloat16).to(f64).tolist()
    ndouble = sum(1 for x, t in zip(xs, twice) if t != _bf16_oracle(x))
    check(ndouble >= 200, f"float64 -> float32 -> bf16 rounds {ndouble} of "
          f"them wrongly (double rounding), so the check can fail")

    # The bf16 emulation's pieces.  store_bf16 rounds a value and its
    # gradient; bf16_linear rounds the weight and bias for the product but
    # not their gradients.
    xg = (torch.randn(5, 7, generator=gr, dtype=f64)).requires_grad_()
    cg = torch.randn(5, 7, generator=gr, dtype=f64)
    (store_bf16(xg) * cg).sum().backward()
    check(torch.equal(store_bf16(xg), round_bf16(xg)) and
          torch.equal(xg.grad, round_bf16(cg)), "store_bf16 rounds its "
          "value forward and its gradient backward")
    xb = round_bf16(torch.randn(6, 5, generator=gr, dtype=f64))
    wb = torch.randn(3, 5, generator=gr, dtype=f64).requires_grad_()
    bb = torch.randn(3, generator=gr, dtype=f64).requires_grad_()
    gb = round_bf16(torch.randn(6, 3, generator=gr, dtype=f64))
    xb.requires_grad_()
    (bf16_linear(xb, wb, bb) * gb).sum().backward()
    check(torch.equal(bf16_linear(xb, wb, bb).detach(),
                      xb.detach() @ round_bf16(wb.detach()).T +
                      round_bf16(bb.detach()))
          and torch.equal(xb.grad, gb @ round_bf16(wb.detach())) and
          torch.equal(wb.grad, gb.T @ xb.detach()) and
          torch.equal(bb.grad, gb.sum(0)),
          "bf16_linear: the weight and bias rounded for the products, "
          "dweight and dbias unrounded")

    # bf16_attention against autograd through the same roundings put as
    # straight-through functions: P rounded where it multiplies v (its
    # gradient passed on unrounded into the softmax's backward), and the
    # gradient of q.k^T rounded where it multiplies q and k.
    class _RoundGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            return round_bf16(g)

    def att_autograd(q, k, v):
        T_, hs_ = q.shape[-2], q.shape[-1]
        mask = torch.ones(T_, T_, dtype=torch.bool).triu(1)
        z = _RoundGrad.apply(q @ k.transpose(-2, -1))
        pp = (z * (1.0 / math.sqrt(hs_))).masked_fill(
            mask, float("-inf")).softmax(-1)
        pr = pp + (round_bf16(pp) - pp).detach()
        return pr @ v

    qa, ka, va = (round_bf16(torch.randn(2, 3, 9, 5, generator=gr,
                                         dtype=f64)).requires_grad_()
                  for _ in range(3))
    ga = round_bf16(torch.randn(2, 3, 9, 5, generator=gr, dtype=f64))
    oa = bf16_attention(qa, ka, va)
    da = torch.autograd.grad(oa, (qa, ka, va), ga)
    ob = att_autograd(qa, ka, va)
    db = torch.autograd.grad(ob, (qa, ka, va), ga)
    dev = max(float((x - y).abs().max()) for x, y in zip((oa,) + da,
                                                          (ob,) + db))
    check(dev < 1e-12, f"bf16_attention equals autograd through its "
          f"roundings (max difference {dev:.1e})")

    # The whole model under bf16: exactly 8 stores a layer and 2 more
    # (ln_f, logits), each value and each gradient a bf16 value, in
    # float32 and float64.
    for dt in (torch.float32, torch.float64):
        seen = []

        def rec(t):
            # The gradient of store_bf16's input is what it stored.
            t.register_hook(lambda g: seen.append(g))
            t = store_bf16(t)
            seen.append(t)
            return t
        pd = {n: torch.tensor(wr[n], dtype=dt, requires_grad=True)
              for n in wr}
        _, lb = gpt_forward(pd, cfg, *mbs[0], linear=bf16_linear,
                            attend=bf16_attention, store=rec)
        lb.backward()
        nvals = len(seen)
        rep = all(torch.equal(t.detach(), round_bf16(t.detach()))
                  for t in seen)
        check(nvals == 2 * (8 * cfg["layers"] + 2) and rep,
              f"bf16 {str(dt)[6:]}: {nvals // 2} activations and their "
              f"gradients stored, every value a bf16 value")
    tb = {d: Trainer(cfg, wr, Hyper(steps=1), d, bf16=True)
          for d in (torch.float32, torch.float64)}
    with torch.no_grad():
        lb32 = tb[torch.float32].forward(tb[torch.float32].params, cfg,
                                         *mbs[0])[1].item()
        lb64 = tb[torch.float64].forward(tb[torch.float64].params, cfg,
                                         *mbs[0])[1].item()
        l64 = manual_loss(trr.params, *mbs[0]).item()
    check(abs(lb32 - lb64) <= 1e-4 * abs(lb64) and
          1e-6 < abs(lb64 - l64) / abs(l64) < 1e-2,
          f"bf16 loss {lb32:.7f} (float32), {lb64:.7f} (float64), "
          f"{abs(lb64 - l64) / abs(l64):.1e} from fp32's")

    # Checkpoint round trip with checksums.
    with tempfile.TemporaryDirectory() as d:
        sd = os.path.join(d, "step-00000003")
        arrays = dict(tr32.weights())
        arrays.update(mom)
        write_checkpoint(sd, 3, arrays, [("model", "gpt:x"), ("seed", "1")])
        man, back = read_checkpoint(sd)
        check(man["step"] == 3 and man["state"]["seed"] == "1",
              "checkpoint step and state lines")
        check(all(np.array_equal(back[n], arrays[n]) for n in arrays),
              f"checkpoint round trip of {len(arrays)} tensors")
        if xxh3_lib() is not None:
            check(man["checksum_verified"], "manifest checksum verified")
            with open(os.path.join(sd, "rank-00000.bin"), "r+b") as f:
                f.seek(100)
                b = f.read(1)
                f.seek(100)
                f.write(bytes([b[0] ^ 1]))
            try:
                read_checkpoint(sd)
                check(False, "a flipped data byte is caught")
            except CheckpointError as e:
                check("checksum" in str(e), f"a flipped data byte is caught: "
                      f"{e}")
        else:
            print("skip  libxxhash not loadable: checksums not verified")
        with open(os.path.join(sd, "manifest"), "rb") as f:
            text = f.read()
        with open(os.path.join(sd, "manifest"), "wb") as f:
            f.write(text[:text.rindex(b"end ")])
        try:
            read_manifest(sd)
            check(False, "a manifest without its end line is refused")
        except CheckpointError as e:
            check(True, f"a manifest without its end line is refused: {e}")

    # Batches file and TSV.
    with tempfile.TemporaryDirectory() as d:
        arr = np.arange(3 * 2 * 2 * 4 * 5, dtype="<i4")
        arr.tofile(os.path.join(d, "b"))
        bb = read_batches(os.path.join(d, "b"), 3, 2, 4, 5)
        check(bb[1, 1, 0, 0, 0] == (1 * 2 + 1) * 40 and
              bb[2, 0, 1, 3, 4] == (2 * 2 + 0) * 40 + 20 + 19,
              "batch file order: step, micro-batch, inputs then targets")
    pre, rows = read_flow_tsv("# flow\nstep\tphase\tloss\tlr\tgrad_norm\tms\n"
                              "1\ttrain\t5.5\t0.001\t1.25\t3\n"
                              "1\tval\t5.6\t-\t-\t-\n")
    check(len(pre) == 1 and rows[0]["loss"] == 5.5 and rows[1]["lr"] == "-",
          "flow TSV parsing")
    print(f"{'FAIL' if fails else 'PASS'}: {len(fails)} of the self-test "
          f"checks failed" if fails else "PASS: self-test")
    return 1 if fails else 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="torch_gpt.py",
        description="PyTorch reference of flow-train's GPT-2 training.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest", help=cmd_selftest.__doc__, parents=[common])
    t = sub.add_parser("train", help=cmd_train.__doc__, parents=[common])
    t.add_argument("--ckpt", required=True, help="flow checkpoint step dir")
    t.add_argument("--batches", required=True, help="--dump-batches file")
    t.add_argument("--model", help="model spec (default: the checkpoint's "
                   "'state model' line)")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq-len", type=int, required=True)
    add_hyper_args(t)
    b = sub.add_parser("bench", help=cmd_bench.__doc__, parents=[common])
    b.add_argument("--model", required=True)
    b.add_argument("--batch", type=int, required=True)
    b.add_argument("--seq-len", type=int, required=True)
    b.add_argument("--steps", type=int, default=5)
    b.add_argument("--warmup-steps", type=int, default=1)
    b.add_argument("--seed", type=int, default=1337)
    b.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    b.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: the forward under torch.autocast(bf16)")
    b.add_argument("--compile", action="store_true",
                   help="the forward through torch.compile")
    a = ap.parse_args(argv)
    return {"selftest": cmd_selftest, "train": cmd_train,
            "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
