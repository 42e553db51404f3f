"""Writes the seed corpora of the fuzz targets, with the project's torch.

Usage: make_seeds.py OUTDIR

  OUTDIR/pt/      small torch.save files (and a few safetensors files): zip archives (a few shapes and dtypes, views, a
                  Parameter, an nn.Module state_dict, an optimizer state, CRCs off) and legacy
                  ones (_use_new_zipfile_serialization=False, pickle protocols 2 and 4)
                  plus the project's fixture family (tests/fixtures/torch_family.py: DTensors,
                  quantized, sparse, numpy values, subclasses, odd names, ...) where a file is
                  at most 64 KiB
  OUTDIR/pickle/  the object pickles (`data.pkl`) extracted from the zip archives, the legacy
                  files whole (fuzz_pickle runs ParseLegacy on inputs with the legacy magic),
                  and plain pickles of protocols 0-5
tools/ci/fuzz.sh then makes OUTDIR/zckpt/ from OUTDIR/pt/ with the built `zckpt convert` (raw,
4 KiB chunks, and zstd). Everything is kept small: libFuzzer runs faster on small inputs.
"""
import collections
import os
import pickle
import shutil
import sys
import tempfile
import warnings
import zipfile

import torch

warnings.simplefilter("ignore")  # torch's prototype and scheduler warnings are noise here


def objects():
    torch.manual_seed(0)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.ones(2, 4)).sum().backward()
    opt.step()
    return {
        "scalar": torch.tensor(3.5),
        "vector": torch.arange(5, dtype=torch.int64),
        "dtypes": {
            "f16": torch.ones(3, dtype=torch.float16),
            "bf16": torch.ones(2, 2, dtype=torch.bfloat16),
            "f64": torch.zeros(2, dtype=torch.float64),
            "i8": torch.tensor([-1, 2], dtype=torch.int8),
            "u8": torch.tensor([7], dtype=torch.uint8),
            "b": torch.tensor([True, False]),
            "c64": torch.ones(2, dtype=torch.complex64),
        },
        "views": {"base": base, "t": base.t(), "row": base[1], "col": base[:, 2], "empty": base[:0]},
        "param": torch.nn.Parameter(torch.ones(2, 3)),
        "module": lin.state_dict(),
        "optim": {"model": lin.state_dict(), "optimizer": opt.state_dict(), "step": 7,
                  "meta": collections.OrderedDict(lr=0.1, name="run", flags=(True, None))},
        # Two chunks with --chunk-bytes 4096, still tiny.
        "two_chunks": {"w": torch.arange(2048, dtype=torch.float32), "b": torch.ones(3)},
        "nested": [torch.ones(1), (torch.zeros(2), {"k": torch.ones(1, 1, 1)})],
    }


def write_pt(out_pt, out_pickle):
    names = []
    for name, obj in objects().items():
        path = os.path.join(out_pt, name + ".pt")
        torch.save(obj, path)
        names.append(path)
    # CRCs off (torch writes CRC 0) and no byteorder record, the way some writers do.
    import torch.utils.serialization as serialization
    cfg = getattr(getattr(serialization, "config", None), "save", None)
    if cfg is not None and hasattr(cfg, "compute_crc32"):
        cfg.compute_crc32 = False
        try:
            path = os.path.join(out_pt, "nocrc.pt")
            torch.save({"a": torch.ones(3)}, path)
            names.append(path)
        finally:
            cfg.compute_crc32 = True
    try:
        path = os.path.join(out_pt, "nobyteorder.pt")
        torch.save({"a": torch.ones(3)}, path, _disable_byteorder_record=True)
        names.append(path)
    except TypeError:
        pass
    for proto in (2, 4):
        for name in ("vector", "module", "views"):
            path = os.path.join(out_pt, f"legacy{proto}_{name}.pt")
            torch.save(objects()[name], path, _use_new_zipfile_serialization=False, pickle_protocol=proto)
            with open(path, "rb") as f, open(os.path.join(out_pickle, f"legacy{proto}_{name}.bin"), "wb") as g:
                g.write(f.read())
    names += write_family_seeds(out_pt, out_pickle)
    for path in names:
        if not zipfile.is_zipfile(path):
            continue
        with zipfile.ZipFile(path) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl")]
            if pkl:
                base = os.path.splitext(os.path.basename(path))[0]
                try:
                    data = z.read(pkl[0])
                except zipfile.BadZipFile:  # nocrc.pt: Python's zipfile insists on the CRC
                    continue
                with open(os.path.join(out_pickle, base + ".pkl"), "wb") as g:
                    g.write(data)


def write_family_seeds(out_pt, out_pickle, max_bytes=64 << 10):
    """The fixture family's small files; returns the zip ones (their data.pkl is extracted)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    try:
        import torch_family
    except Exception as e:  # the family is optional here: the seeds above are enough to start
        print(f"make_seeds: no fixture family ({e})", file=sys.stderr)
        return []
    zips = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in torch_family.FAMILY:
            if f.needs():
                continue
            try:
                written = torch_family.write_fixture(f, tmp, "fixture.pt")
            except Exception as e:
                print(f"make_seeds: fixture {f.name} not written: {e}", file=sys.stderr)
                continue
            if os.path.getsize(written.path) > max_bytes:
                continue
            name = "family_" + "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in f.name)
            dest = os.path.join(out_pt, name)
            shutil.copyfile(written.path, dest)
            if zipfile.is_zipfile(dest):
                zips.append(dest)
            else:
                shutil.copyfile(dest, os.path.join(out_pickle, name[:-3] + ".bin"))
    return zips


def write_plain_pickles(out_pickle):
    value = {"a": [1, 2.5, -3, 2**70, None, True], "b": (b"xy", bytearray(b"z"), "é"),
             "c": {1, 2}, "d": frozenset([3]), "e": collections.OrderedDict(x=1)}
    shared = [1, 2]
    value["memo"] = [shared, shared]
    for proto in range(0, 6):
        with open(os.path.join(out_pickle, f"plain{proto}.pkl"), "wb") as f:
            pickle.dump(value, f, protocol=proto)


def write_safetensors(out_pt):
    """A few safetensors files (fuzz_convert reads them too): dtypes, an empty tensor, a scalar,
    metadata, float8 and F4."""
    from safetensors.torch import save_file
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16),
               "i": torch.tensor([1, -2], dtype=torch.int64), "m": torch.tensor([True])},
              os.path.join(out_pt, "dtypes.safetensors"), metadata={"format": "pt"})
    save_file({"e": torch.zeros(0, 4), "s": torch.tensor(2.5, dtype=torch.float64), "u": torch.ones(2, dtype=torch.uint16)},
              os.path.join(out_pt, "edges.safetensors"))
    save_file({"f8": torch.ones(4).to(torch.float8_e4m3fn), "f4": torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)},
              os.path.join(out_pt, "small_floats.safetensors"))
    save_file({}, os.path.join(out_pt, "empty.safetensors"))


def main():
    out = sys.argv[1]
    out_pt, out_pickle = os.path.join(out, "pt"), os.path.join(out, "pickle")
    os.makedirs(out_pt, exist_ok=True)
    os.makedirs(out_pickle, exist_ok=True)
    write_pt(out_pt, out_pickle)
    write_safetensors(out_pt)
    write_plain_pickles(out_pickle)
    n = sum(len(os.listdir(d)) for d in (out_pt, out_pickle))
    print(f"make_seeds: {n} files under {out}")


if __name__ == "__main__":
    main()
