"""Checks that a rewritten .pt loads in torch to the same objects as the original.

Usage: check_torch_load.py ORIGINAL REWRITE [ORIGINAL REWRITE ...]

Both are loaded with torch.load(weights_only=False): the files are the test's own, and
torch's weights-only unpickler refuses pickle protocol 4/5 (FRAME), which the fixtures use. The objects must have the same structure
(container types, keys in order), equal tensors (type, dtype, shape, stride, torch.equal) and the
same storage sharing (tensors that share a storage in one share it in the other). The rewrite
must also pass zipfile.testzip(). Prints OK per pair and exits 0, else says what differs and
exits 1. Several pairs per run, so torch is imported once.
"""
import sys
import zipfile

import torch


def compare(a, b, path, storages):
    if type(a) is not type(b):
        raise AssertionError(f"{path}: type {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
            raise AssertionError(f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)} (or strides differ)")
        if not torch.equal(a, b):
            raise AssertionError(f"{path}: tensor values differ")
        storages.append((a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr(), path))
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"{path}: keys {list(a.keys())[:5]}... != {list(b.keys())[:5]}...")
        for key in a:
            compare(a[key], b[key], f"{path}[{key!r}]", storages)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{i}]", storages)
    elif a != b:
        raise AssertionError(f"{path}: {a!r} != {b!r}")


def check_pair(original, rewrite):
    with zipfile.ZipFile(rewrite) as z:
        bad = z.testzip()
        if bad is not None:
            raise SystemExit(f"zipfile.testzip() reports a bad entry in {rewrite}: {bad}")
    a = torch.load(original, weights_only=False)
    b = torch.load(rewrite, weights_only=False)
    storages = []
    compare(a, b, "obj", storages)
    # Sharing: the map original-storage -> rewrite-storage must be one-to-one.
    forward, backward = {}, {}
    for pa, pb, path in storages:
        if forward.setdefault(pa, pb) != pb or backward.setdefault(pb, pa) != pa:
            raise AssertionError(f"{path}: storage sharing differs between original and rewrite")
    print(f"OK {len(storages)} tensors")


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        raise SystemExit(__doc__)
    for i in range(0, len(args), 2):
        try:
            check_pair(args[i], args[i + 1])
        except AssertionError as e:
            raise AssertionError(f"{args[i + 1]}: {e}") from e


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        raise SystemExit(f"mismatch: {e}")
