"""Writer for flow's kernel test fixtures (format FLOWFIX1).

A fixture file holds named arrays of float32 or int32.  Layout, every
integer little-endian:

    offset  size        field
    0       8           magic, the ASCII bytes "FLOWFIX1" (the 1 is the version)
    8       4  u32      count: number of arrays, 1..4096
    then count records, each:
            2  u16      name_len, 1..255
            name_len    name: ASCII 0x21..0x7e, unique within the file
            1  u8       dtype: 1 = float32 (IEEE 754), 2 = int32
            1  u8       ndim, 0..8 (0 = scalar, one element)
            8*ndim u64  dims, outermost first (row-major)
            4*prod(dims) data, little-endian
    end-4   4  u32      CRC-32 (zlib/IEEE 802.3) of every byte before it

The file ends right after the CRC; readers reject anything else (see
tests/unit/fixture.c and tests/ref/README.md).
"""

import os
import struct
import zlib

import numpy as np

MAGIC = b"FLOWFIX1"
DTYPE_F32 = 1
DTYPE_I32 = 2
MAX_ARRAYS = 4096
MAX_NDIM = 8


def _encode(name, arr):
    arr = np.asarray(arr)
    if arr.dtype == np.float32 or arr.dtype == np.float64:
        code, data = DTYPE_F32, arr.astype("<f4")
    elif arr.dtype.kind in "iu":
        if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
            raise ValueError(f"{name}: value does not fit in int32")
        code, data = DTYPE_I32, arr.astype("<i4")
    else:
        raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
    raw = name.encode("ascii")
    if not 1 <= len(raw) <= 255 or any(b < 0x21 or b > 0x7E for b in raw):
        raise ValueError(f"bad array name {name!r}")
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"{name}: more than {MAX_NDIM} dimensions")
    head = struct.pack("<H", len(raw)) + raw + struct.pack("<BB", code, arr.ndim)
    head += b"".join(struct.pack("<Q", d) for d in arr.shape)
    return head + np.ascontiguousarray(data).tobytes()


def write_fixture(path, arrays):
    """Write arrays (a dict name -> numpy array, in insertion order) to path,
    through a temporary file renamed into place."""
    if not 1 <= len(arrays) <= MAX_ARRAYS:
        raise ValueError("a fixture holds 1..4096 arrays")
    body = MAGIC + struct.pack("<I", len(arrays))
    body += b"".join(_encode(k, v) for k, v in arrays.items())
    body += struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(body)
    os.replace(tmp, path)
    return len(body)
