#!/usr/bin/python3
"""Write the small token inputs under tests/data/good and tests/data/bad.

Run from anywhere with the system Python (struct and numpy only):

    /usr/bin/python3 tests/data/make-data.py

The files are committed; rerunning rewrites them byte for byte the same.
tests/data/README lists each file and the exact error a bad one must give.
"""
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LLMC_MAGIC = 20240520


def write(sub, name, data):
    path = os.path.join(HERE, sub, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def llmc(tokens, version=1, count=None, magic=LLMC_MAGIC):
    """An llm.c token file: 256 little-endian int32 (magic, version, count,
    zeros), then the tokens as uint16 (version 1) or uint32 (version 2)."""
    header = [0] * 256
    header[0] = magic
    header[1] = version
    header[2] = len(tokens) if count is None else count
    fmt = "<%dH" if version == 1 else "<%dI"
    return struct.pack("<256i", *header) + struct.pack(fmt % len(tokens), *tokens)


def npy(array):
    """Bytes of np.save(array) (format version 1.0)."""
    import io
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_raw_header(header_text, data=b""):
    """A version 1.0 .npy with a hand-written header dictionary, padded
    like numpy pads (total header a multiple of 64 bytes, ending in \\n)."""
    text = header_text.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + b" " * (pad % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


# GPT-2 ids of "Hello, world" plus <|endoftext|>.
HELLO = [15496, 11, 995, 50256]

# ---- good ------------------------------------------------------------------
write("good", "hello.txt", b"hello, world\n")
write("good", "tiny.llmc.bin", llmc(HELLO + [0], version=1))
write("good", "tiny32.llmc.bin", llmc([1, 70000, 100000, 128000], version=2))
write("good", "tiny.npy", npy(np.array(HELLO, dtype="<i4")))
write("good", "tiny.u16", struct.pack("<4H", *HELLO))
write("good", "tiny.u32", struct.pack("<2I", 1, 70000))

# ---- bad -------------------------------------------------------------------
# Header claims 10 tokens, 6 present: 1044 bytes expected, 1036 found.
write("bad", "truncated.llmc.bin", llmc([1, 2, 3, 4, 5, 6], count=10))
# Header claims 4 tokens, 6 present: 1032 bytes expected, 1036 found.
write("bad", "trailing.llmc.bin", llmc([1, 2, 3, 4, 5, 6], count=4))
write("bad", "badmagic.llmc.bin", llmc(HELLO, magic=12345))
write("bad", "badversion.llmc.bin", llmc(HELLO, version=3)[:1024]
      + struct.pack("<4H", *HELLO))
write("bad", "empty.llmc.bin", llmc([]))
write("bad", "float32.npy", npy(np.array([1.0, 2.0], dtype="<f4")))
write("bad", "negative.npy", npy(np.array([5, -1, 7], dtype="<i4")))
write("bad", "fortran.npy",
      npy(np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3))))
write("bad", "badheader.npy",
      npy_raw_header("{'descr': '<i4', 'fortran_order': False, }",
                     struct.pack("<3i", 1, 2, 3)))
# Shape (10,) of int32 but 4 values: 168 bytes expected, 144 found.
write("bad", "truncated.npy",
      npy(np.arange(10, dtype="<i4"))[:128 + 16])
write("bad", "bigtoken.npy", npy(np.array([1, 70000], dtype="<i8")))
write("bad", "bigtoken.u16", struct.pack("<4H", 1, 2, 60000, 3))
write("bad", "odd.u16", b"\x01\x00\x02\x00\x03")
write("bad", "empty.txt", b"")
