#!/usr/bin/env python3
"""foreign_seeds.py DIR: the seed corpus of fuzz_safetensors (plain Python,
no dependencies; make-corpus.sh runs it).  Harness byte first
(fuzz_safetensors.c): 0 safetensors file, 1 llm.c model file, 2 HF
directory, 3 HF directory with an index; parts cut at the separator."""
import json
import os
import struct
import sys

SEP = b"\n--8<--\n"
L, H, C, V, VP, T = 1, 1, 4, 8, 8, 4


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] -> file bytes."""
    header, at, data = {}, 0, b""
    if meta:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape,
                        "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(n, start=0.0):
    return struct.pack(f"<{n}f", *[start + 0.25 * i for i in range(n)])


def gpt2(prefix="transformer."):
    """(name, shape) of a tiny GPT-2 in HF layout."""
    out = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]),
                (p + "attn.c_attn.weight", [C, 3 * C]),
                (p + "attn.c_attn.bias", [3 * C]),
                (p + "attn.c_proj.weight", [C, C]),
                (p + "attn.c_proj.bias", [C]),
                (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]),
                (p + "mlp.c_fc.weight", [C, 4 * C]),
                (p + "mlp.c_fc.bias", [4 * C]),
                (p + "mlp.c_proj.weight", [4 * C, C]),
                (p + "mlp.c_proj.bias", [C])]
    out += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    return [(prefix + n, s) for n, s in out]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)

    def seed(name, data):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)

    seed("st-small", b"\0" + safetensors(
        [("a", "F32", [2, 2], f32(4)), ("b", "BF16", [3], b"\x80\x3f" * 3),
         ("empty", "U8", [0], b"")], {"format": "pt"}))
    seed("st-empty", b"\0" + safetensors([]))
    # llm.c: header, then the parameters in llm.c's order
    n = (VP * C + T * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C
                               + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C)
    for version, width in ((3, 4), (5, 2)):
        hdr = struct.pack("<256i", 20240326, version, T, V, L, H, C, VP,
                          *([0] * 248))
        body = f32(n) if width == 4 else b"\x80\x3f" * n
        seed(f"llmc-v{version}", b"\1" + hdr + body)
    config = json.dumps({"model_type": "gpt2", "n_layer": L, "n_head": H,
                         "n_embd": C, "n_positions": T,
                         "vocab_size": V}).encode()
    ts = [(n, "F32", s, f32(numel(s))) for n, s in gpt2()]
    seed("hf-plain", b"\2" + config + SEP +
         safetensors(ts, {"format": "pt"}))
    bare = [(n, "F32", s, f32(numel(s))) for n, s in gpt2("")]
    seed("hf-bare-names", b"\2" + config + SEP + safetensors(bare))
    half = len(ts) // 2
    files = ["model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors"]
    wmap = {n: files[0 if i < half else 1] for i, (n, *_) in enumerate(ts)}
    index = json.dumps({"metadata": {"total_size": 0},
                        "weight_map": wmap}).encode()
    seed("hf-sharded", b"\3" + config + SEP + index + SEP +
         safetensors(ts[:half]) + SEP + safetensors(ts[half:]))


if __name__ == "__main__":
    main()
