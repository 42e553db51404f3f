"""Writes safetensors files with the `safetensors` package itself, for the C++ header tests.

Usage: make_fixtures.py OUTDIR

Every dtype safetensors.torch.save_file writes (F8_E8M0 and F4 included), empty tensors (several at one offset), a 0-dim tensor,
metadata (one key, several keys, none), an empty file, odd names, and one tensor of each dtype
in one file. OUTDIR/manifest.json says, per file, what Python reads from the header: the
tensors in byte-buffer order (name, dtype, shape, data_offsets) and the metadata in header
order.
"""
import json
import os
import struct
import sys
import warnings

import torch
from safetensors.torch import save_file

warnings.simplefilter("ignore")

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]


def tensor(dtype, shape, seed):
    """Random bytes viewed as `dtype` (bool: 0 or 1), contiguous, of `shape`."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


FILES = {
    "every_dtype.safetensors": ({f"t.{dt}".replace("torch.", ""): tensor(dt, [3, 2], i) for i, dt in enumerate(DTYPES)},
                                {"format": "pt"}),
    "empty_tensors.safetensors": ({"a": torch.zeros(0), "b": torch.zeros(2, 0, 3), "c": torch.ones(2),
                                   "d": torch.zeros(0, dtype=torch.int64)}, None),
    "scalar.safetensors": ({"s": torch.tensor(2.5, dtype=torch.float64)}, {"a": "1", "b": "2", "c": "x\ny"}),
    "nothing.safetensors": ({}, None),
    "only_metadata.safetensors": ({}, {"k": "v"}),
    "names.safetensors": ({"": torch.ones(1), "é/ü.w": torch.ones(2), 'q"uote\\back\tslash': torch.ones(1, dtype=torch.int8),
                           "model.layers.10.w": torch.ones(1), "model.layers.9.w": torch.ones(1)}, {"ключ": "значение"}),
    "big.safetensors": ({f"layer.{i}": tensor(torch.bfloat16, [64, 33], i) for i in range(40)}, {"format": "pt"}),
}


def header(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8:8 + n])
    meta = h.pop("__metadata__", None)
    tensors = sorted(({"name": k, **v} for k, v in h.items()), key=lambda t: tuple(t["data_offsets"]))
    return {"header_bytes": n, "file_bytes": len(data), "tensors": tensors,
            "metadata": None if meta is None else [[k, v] for k, v in meta.items()]}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = {}
    for name, (tensors, metadata) in FILES.items():
        path = os.path.join(out, name)
        save_file(tensors, path, metadata=metadata)
        manifest[name] = header(path)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main()
