"""Writes the .pt fixtures for the C++ tests of src/pt, with torch itself.

Usage: make_fixtures.py OUTDIR

OUTDIR/fixtures.txt lists one fixture a line: file <TAB> kind <TAB> expected record prefix, where
kind is zip (a torch.save archive), nocrc (one written with CRCs off), legacy, legacy-tar,
torchscript, or deflate / plainzip (zips written by Python's zipfile). For every zip, OUTDIR/<file>.manifest and <file>.bytes describe
it as Python's zipfile reads it (see zip_manifest.py).
"""
import io
import os
import sys
import tarfile
import zipfile

import torch
import torch.utils.serialization as serialization

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zip_manifest import describe_zip  # noqa: E402

NON_ASCII_NAME = "modèle_权重.pt"


def many_tensors():
    torch.manual_seed(0)
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    tensors = {
        "f32": torch.randn(5, 7),
        "f64": torch.randn(3, dtype=torch.float64),
        "f16": torch.randn(4, 4).half(),
        "bf16": torch.randn(9).bfloat16(),
        "i8": torch.randint(-128, 127, (11,), dtype=torch.int8),
        "i16": torch.randint(-1000, 1000, (6,), dtype=torch.int16),
        "i32": torch.randint(-(2**31), 2**31 - 1, (6,), dtype=torch.int32),
        "i64": torch.arange(-5, 5, dtype=torch.int64),
        "u8": torch.randint(0, 255, (13,), dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(3, dtype=torch.complex64),
        "c128": torch.randn(2, dtype=torch.complex128),
        "u16": torch.arange(7, dtype=torch.int32).to(torch.uint16),
        "f8": torch.randn(8).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "base": base,
        "view_row": base[1],          # shares base's storage
        "transposed": base.transpose(0, 2),
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "big": torch.randn(3 * 1024 * 1024 // 4 + 5),  # > AtomicFile's 1 MiB buffer, odd size
    }
    tensors["nested"] = {"list": [torch.zeros(3), torch.ones(1, dtype=torch.int64)], "tuple": (torch.tensor([7]),)}
    return tensors


def save_zip_fixtures(out, fixtures):
    def save(name, obj, prefix, **kwargs):
        torch.save(obj, os.path.join(out, name), **kwargs)
        fixtures.append((name, "zip", prefix))

    save("small.pt", {"a": torch.arange(3, dtype=torch.int16)}, "small")
    save("empty.pt", {}, "empty")
    save("many.pt", many_tensors(), "many")
    save("t20k.pt", {f"t{i}": torch.tensor([i], dtype=torch.int32) for i in range(20000)}, "t20k")
    for protocol in (2, 4, 5):
        save(f"proto{protocol}.pt", many_tensors(), f"proto{protocol}", pickle_protocol=protocol)
    save(NON_ASCII_NAME, {"w": torch.ones(3)}, "archive")
    save("module.pt", torch.nn.Linear(3, 2).state_dict(), "module")

    buffer = io.BytesIO()
    torch.save({"b": torch.arange(10)}, buffer)
    with open(os.path.join(out, "buffer.pt"), "wb") as f:
        f.write(buffer.getvalue())
    fixtures.append(("buffer.pt", "zip", "archive"))

    serialization.config.save.compute_crc32 = False
    try:
        torch.save({"n": torch.arange(16)}, os.path.join(out, "nocrc.pt"))
        fixtures.append(("nocrc.pt", "nocrc", "nocrc"))
    finally:
        serialization.config.save.compute_crc32 = True


def save_other_formats(out, fixtures):
    for protocol in (2, 4, 5):
        name = f"legacy{protocol}.pt"
        torch.save({"a": torch.ones(2)}, os.path.join(out, name), _use_new_zipfile_serialization=False,
                   pickle_protocol=protocol)
        fixtures.append((name, "legacy", ""))

    # torch <= 0.3 wrote a tar of pickles ('sys_info', 'pickle', 'storages', 'tensors').
    with tarfile.open(os.path.join(out, "legacy_tar.pt"), "w") as tar:
        for member in ("sys_info", "pickle", "storages", "tensors"):
            data = b"\x80\x02N."
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fixtures.append(("legacy_tar.pt", "legacy-tar", ""))

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    torch.jit.save(torch.jit.trace(AddOne(), torch.ones(2)), os.path.join(out, "torchscript.pt"))
    fixtures.append(("torchscript.pt", "torchscript", "torchscript"))

    # The records of small.pt re-zipped by Python: once deflated, once stored without torch's
    # alignment padding or ZIP64 records.
    with zipfile.ZipFile(os.path.join(out, "small.pt")) as src:
        for name, compression in (("deflate.zip", zipfile.ZIP_DEFLATED), ("plainzip.zip", zipfile.ZIP_STORED)):
            with zipfile.ZipFile(os.path.join(out, name), "w", compression=compression) as dst:
                for info in src.infolist():
                    dst.writestr(info.filename, src.read(info))
            fixtures.append((name, "deflate" if compression == zipfile.ZIP_DEFLATED else "plainzip", "small"))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    fixtures = []
    save_zip_fixtures(out, fixtures)
    save_other_formats(out, fixtures)
    with open(os.path.join(out, "fixtures.txt"), "w", encoding="utf-8") as listing:
        for name, kind, prefix in fixtures:
            if kind in ("zip", "nocrc", "torchscript", "deflate", "plainzip"):
                path = os.path.join(out, name)
                describe_zip(path, path + ".manifest", path + ".bytes", crc_skipped=kind == "nocrc")
            listing.write(f"{name}\t{kind}\t{prefix}\n")


if __name__ == "__main__":
    main()
