#!/usr/bin/python3
"""Cross-check of flow's Hugging Face GPT-2 export (flow/safetensors.h)
with code that shares nothing with it: a plain-Python safetensors parser
(Debian has no python3-safetensors), PyTorch's own bf16/f16 rounding and a
GPT-2 forward written in transformers' Conv1D convention.

    /usr/bin/python3 tests/ref/safetensors_check.py --lib build/lib/.libs/libflow.so \\
        --work-dir /tmp/st-check

Writes a flow checkpoint of a small GPT-2 (tests/ref/torch_gpt.py), calls
flow_hf_gpt2_export through ctypes (f32 in one file, bf16 and f16 sharded),
then checks: the files follow the format (header JSON, offsets contiguous
from 0, sizes, exact length, 8-byte aligned data), the index names every
tensor's file, config.json holds the model, every tensor equals flow's
(Conv1D weights transposed, padded vocabulary rows dropped) bit for bit in
f32 and as torch rounds it in bf16/f16, the HF-convention forward matches
flow's (torch_gpt.gpt_forward) logits, and flow_hf_gpt2_import gives back
the same weights.  Prints one ok/FAIL line per check; exit 1 on a FAIL.
"""
import argparse
import ctypes
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

SPEC = "gpt:layers=2,heads=2,dim=32,vocab=100,seq=16,pad=64"
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
          "mlp.c_proj.weight")
ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16,
             "F16": torch.float16}
FLOW_DTYPE = {"f32": 0, "bf16": 1, "f16": 2}

failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


class Diag(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class Shape(ctypes.Structure):
    _fields_ = [("ndim", ctypes.c_int), ("dims", ctypes.c_int64 * 8)]


class TensorDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128), ("dtype", ctypes.c_int),
                ("shape", Shape), ("mesh", ctypes.c_char * 64),
                ("sbp", ctypes.c_char * 64)]


class KV(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class ExportOptions(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("max_shard_size", ctypes.c_uint64)]


def flow_call(lib, fn, *args):
    d = Diag()
    err = getattr(lib, fn)(*args, ctypes.byref(d))
    if err != 0:
        raise RuntimeError(f"{fn}: {d.msg.decode()}")


def export(lib, step_dir, out_dir, dtype, max_shard):
    ck = ctypes.c_void_p()
    flow_call(lib, "flow_ckpt_open", step_dir.encode(), ctypes.byref(ck))
    try:
        opt = ExportOptions(FLOW_DTYPE[dtype], max_shard)
        flow_call(lib, "flow_hf_gpt2_export", ck, out_dir.encode(),
                  ctypes.byref(opt))
    finally:
        lib.flow_ckpt_free(ck)


def write_checkpoint(lib, step_dir, step, arrays, state):
    """A one-rank f32 checkpoint written by libflow itself."""
    w = ctypes.c_void_p()
    flow_call(lib, "flow_ckpt_writer_new", step_dir.encode(), 0,
              ctypes.byref(w))
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        d = TensorDesc(name.encode(), 0, Shape(a.ndim, (ctypes.c_int64 * 8)(
            *a.shape)), b"1", b"(B)")
        flow_call(lib, "flow_ckpt_writer_add", w, ctypes.byref(d), None,
                  a.ctypes.data_as(ctypes.c_void_p))
    flow_call(lib, "flow_ckpt_writer_finish", w)
    kv = (KV * len(state))(*[KV(k.encode(), v.encode()) for k, v in state])
    flow_call(lib, "flow_ckpt_commit", step_dir.encode(),
              ctypes.c_uint64(step), 1, kv, ctypes.c_size_t(len(state)))


def read_safetensors(path):
    """{name: torch tensor} of one file, checking the format as we go."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    check(data[8:9] == b"{" and (8 + n) % 8 == 0,
          f"{os.path.basename(path)}: header starts with '{{', data aligned")
    check(header.get("__metadata__", {}).get("format") == "pt",
          f"{os.path.basename(path)}: __metadata__ format pt")
    header.pop("__metadata__", None)
    buf = data[8 + n:]
    at, out = 0, {}
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, e = t["data_offsets"]
        dt = ST_DTYPES[t["dtype"]]
        numel = math.prod(t["shape"])
        if b != at or e - b != numel * torch.tensor([], dtype=dt).element_size():
            check(False, f"{name}: offsets [{b}, {e}] after {at}")
        at = e
        raw = bytearray(buf[b:e])
        out[name] = torch.frombuffer(raw, dtype=dt).reshape(t["shape"]) \
            if numel else torch.zeros(t["shape"], dtype=dt)
    check(at == len(buf), f"{os.path.basename(path)}: length exact")
    return out


def read_hf_dir(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    tensors, where = {}, {}
    for f in files:
        for name, t in read_safetensors(os.path.join(d, f)).items():
            tensors[name] = t
            where[name] = f
    idx = os.path.join(d, "model.safetensors.index.json")
    if len(files) > 1:
        with open(idx) as f:
            index = json.load(f)
        check(index["weight_map"] == where, f"{d}: index weight_map")
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        check(index["metadata"]["total_size"] == size, f"{d}: total_size")
    else:
        check(not os.path.exists(idx) and files == ["model.safetensors"],
              f"{d}: one model.safetensors, no index")
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    return tensors, config


def hf_forward(t, cfg, idx):
    """GPT-2 in transformers' layout: Conv1D y = x @ W + b, W [in, out]."""
    pre = "transformer."
    B, T = idx.shape
    C, NH = cfg["n_embd"], cfg["n_head"]
    hs = C // NH
    x = t[pre + "wte.weight"][idx] + t[pre + "wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def conv1d(a, name):
        return torch.addmm(t[name + ".bias"], a.reshape(-1, a.shape[-1]),
                           t[name + ".weight"]).reshape(*a.shape[:-1], -1)

    for i in range(cfg["n_layer"]):
        h = f"{pre}h.{i}."
        a = F.layer_norm(x, (C,), t[h + "ln_1.weight"], t[h + "ln_1.bias"],
                         cfg["layer_norm_epsilon"])
        q, k, v = conv1d(a, h + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(B, T, NH, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        m = F.layer_norm(x, (C,), t[h + "ln_2.weight"], t[h + "ln_2.bias"],
                         cfg["layer_norm_epsilon"])
        x = x + conv1d(F.gelu(conv1d(m, h + "mlp.c_fc"), approximate="tanh"),
                       h + "mlp.c_proj")
    x = F.layer_norm(x, (C,), t[pre + "ln_f.weight"], t[pre + "ln_f.bias"],
                     cfg["layer_norm_epsilon"])
    return x @ t[pre + "wte.weight"].T  # tied lm_head


def expected(name, arr, cfg):
    """flow's array as HF stores it."""
    t = torch.from_numpy(arr)
    if name == "wte":
        t = t[:cfg["vocab"]]
    if name.endswith(CONV1D):
        t = t.T.contiguous()
    return t


def hf_name(name):
    return "transformer." + (name + ".weight" if name in ("wte", "wpe")
                             else name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libflow.so")
    ap.add_argument("--work-dir", required=True)
    args = ap.parse_args()
    lib = ctypes.CDLL(os.path.abspath(args.lib))
    cfg = torch_gpt.parse_spec(SPEC)
    os.makedirs(args.work_dir, exist_ok=True)
    step = os.path.join(args.work_dir, "step-00000003")
    weights = torch_gpt.gpt2_init(cfg, seed=7)
    g = torch.Generator().manual_seed(3)
    for name, a in weights.items():  # non-trivial norms and biases too
        noise = torch.randn(a.shape, generator=g).numpy().astype(np.float32)
        if name == "wte":
            noise[cfg["vocab"]:] = 0
        weights[name] = a + 0.1 * noise
    write_checkpoint(lib, step, 3, weights,
                     state=[("model", SPEC),
                            ("contents", "training")])
    idx = torch.randint(0, cfg["vocab"], (2, cfg["seq"]), generator=g)
    p = {k: torch.from_numpy(v) for k, v in weights.items()}
    flow_logits, _ = torch_gpt.gpt_forward(p, cfg, idx)
    flow_logits = flow_logits[..., :cfg["vocab"]]

    for dtype, shard in (("f32", 0), ("bf16", 20000), ("f16", 20000)):
        out = os.path.join(args.work_dir, f"hf-{dtype}")
        export(lib, step, out, dtype, shard)
        tensors, config = read_hf_dir(out)
        check(config["model_type"] == "gpt2" and
              config["n_layer"] == cfg["layers"] and
              config["n_head"] == cfg["heads"] and
              config["n_embd"] == cfg["dim"] and
              config["n_positions"] == cfg["seq"] and
              config["vocab_size"] == cfg["vocab"],
              f"{dtype}: config.json describes the model")
        check(set(tensors) == {hf_name(n) for n in weights},
              f"{dtype}: the tensor names are transformers' GPT-2 names")
        torch_dt = ST_DTYPES[dtype.upper()]
        same = all(torch.equal(tensors[hf_name(n)],
                               expected(n, a, cfg).to(torch_dt))
                   for n, a in weights.items())
        check(same, f"{dtype}: every tensor equals flow's as torch rounds it")
        t32 = {k: v.float() for k, v in tensors.items()}
        logits = hf_forward(t32, config, idx)
        tol = 1e-4 if dtype == "f32" else 0.1
        err = (logits - flow_logits).abs().max().item()
        check(err <= tol, f"{dtype}: Conv1D forward matches flow's logits "
                          f"(max |diff| {err:.2e} <= {tol})")
        if dtype == "f32":
            back = os.path.join(args.work_dir, "back")
            flow_call(lib, "flow_hf_gpt2_import", out.encode(), back.encode())
            man, arrays = torch_gpt.read_checkpoint(back)
            check(all(np.array_equal(arrays[n], a) for n, a in weights.items())
                  and len(arrays) == len(weights),
                  "f32: flow_hf_gpt2_import gives the weights back")
    print("PASS" if not failures else f"FAIL: {failures} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
