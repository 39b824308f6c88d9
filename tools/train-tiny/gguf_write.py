"""Minimal GGUF v3 writer (and reader): little-endian, alignment 32.

Layout: header (magic, version, tensor count, kv count), key/value metadata, tensor
infos (name, dims innermost first, type, offset), padding to the alignment, tensor data
(each tensor starts at an aligned offset relative to the data section).
"""
import struct

import numpy as np

ALIGNMENT = 32

# Metadata value types.
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, \
    T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALAR_FMT = {T_UINT8: "B", T_INT8: "b", T_UINT16: "H", T_INT16: "h", T_UINT32: "I",
               T_INT32: "i", T_FLOAT32: "f", T_BOOL: "?", T_UINT64: "Q", T_INT64: "q",
               T_FLOAT64: "d"}

# Tensor types (ggml_type).
GGML_F32, GGML_F16 = 0, 1
_NP_DTYPE = {GGML_F32: np.float32, GGML_F16: np.float16}


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pad(n):
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


class GGUFWriter:
    def __init__(self):
        self.kv = []       # (key, type, value, elem_type)
        self.tensors = []  # (name, np.ndarray, ggml_type)

    def add(self, key, vtype, value, elem_type=None):
        self.kv.append((key, vtype, value, elem_type))

    def add_string(self, key, v): self.add(key, T_STRING, v)
    def add_u32(self, key, v): self.add(key, T_UINT32, v)
    def add_f32(self, key, v): self.add(key, T_FLOAT32, v)
    def add_bool(self, key, v): self.add(key, T_BOOL, v)
    def add_array(self, key, elem_type, values): self.add(key, T_ARRAY, list(values), elem_type)

    def add_tensor(self, name, array, ggml_type):
        """array uses PyTorch/numpy order ([rows, cols]); GGUF dims are written reversed."""
        self.tensors.append((name, np.ascontiguousarray(array, dtype=_NP_DTYPE[ggml_type]),
                             ggml_type))

    @staticmethod
    def _value(vtype, v):
        if vtype == T_STRING:
            return _str(v)
        return struct.pack("<" + _SCALAR_FMT[vtype], v)

    def write(self, path):
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, vtype, value, elem_type in self.kv:
            out += _str(key) + struct.pack("<I", vtype)
            if vtype == T_ARRAY:
                out += struct.pack("<IQ", elem_type, len(value))
                for v in value:
                    out += self._value(elem_type, v)
            else:
                out += self._value(vtype, value)
        offset = 0
        for name, arr, gtype in self.tensors:
            dims = arr.shape[::-1]  # ne[0] is the innermost (contiguous) dimension
            out += _str(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", gtype, offset)
            offset += arr.nbytes + _pad(arr.nbytes)
        out += b"\0" * _pad(len(out))
        with open(path, "wb") as f:
            f.write(out)
            for _, arr, _ in self.tensors:
                f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
                f.write(b"\0" * _pad(arr.nbytes))


def read_gguf(path, writable=False):
    """Returns (metadata dict, {name: np.ndarray in PyTorch order}).

    The arrays are views of a memory map of the file (a 1 GB model is not read into memory);
    with writable=True, assigning to them rewrites the file's tensor data in place (the
    metadata and tensor layout stay as they are).
    """
    data = np.memmap(path, dtype=np.uint8, mode="r+" if writable else "r")
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def string():
        nonlocal pos
        n = take("Q")
        s = bytes(data[pos:pos + n]).decode("utf-8")
        pos += n
        return s

    def value(vtype):
        if vtype == T_STRING:
            return string()
        if vtype == T_ARRAY:
            et, n = take("IQ")
            return [value(et) for _ in range(n)]
        return take(_SCALAR_FMT[vtype])

    assert bytes(data[:4]) == b"GGUF", "not a GGUF file"
    pos = 4
    version, n_tensors, n_kv = take("IQQ")
    assert version == 3
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        gtype, off = take("IQ")
        infos.append((name, dims, gtype, off))
    base = pos + _pad(pos)
    tensors = {}
    for name, dims, gtype, off in infos:
        dt = np.dtype(_NP_DTYPE[gtype]).newbyteorder("<")
        count = int(np.prod(dims))
        start = base + off
        arr = data[start:start + count * dt.itemsize].view(dt)
        tensors[name] = arr.reshape(dims[::-1])
    return meta, tensors
