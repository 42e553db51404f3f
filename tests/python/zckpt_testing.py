"""Helpers shared by the Python tests (not a test module): where the build is, the `zckpt`
tool, reading a container's layout, damaging files, crafting hostile `.pt` files, and finding
the file mappings of this process."""
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
if FIXTURES not in sys.path:
    sys.path.insert(0, FIXTURES)


def build_root():
    """The meson build folder: ZCKPT_BUILD_ROOT, else the folder above tools/zckpt (ZCKPT_BIN),
    else the one holding the imported package (BUILD/src/python/zckpt/__init__.py)."""
    if os.environ.get("ZCKPT_BUILD_ROOT"):
        return os.path.abspath(os.environ["ZCKPT_BUILD_ROOT"])
    if os.environ.get("ZCKPT_BIN"):
        return os.path.dirname(os.path.dirname(os.path.abspath(os.environ["ZCKPT_BIN"])))
    import zckpt

    return os.path.abspath(os.path.join(os.path.dirname(zckpt.__file__), "..", "..", ".."))


def zckpt_bin():
    return os.environ.get("ZCKPT_BIN") or os.path.join(build_root(), "tools", "zckpt")


def run_cli(*args, check=False):
    return subprocess.run([zckpt_bin(), *map(str, args)], capture_output=True, text=True, check=check, timeout=120)


def ls_json(path):
    """`zckpt ls --json PATH` as a dict (tensors, storages with their payload offsets, ...)."""
    return json.loads(run_cli("ls", "--json", path, check=True).stdout)


def storage_of(path, tensor_name):
    """The storage record (key, offset, bytes, ...) holding the tensor called `tensor_name`."""
    info = ls_json(path)
    (tensor,) = [t for t in info["tensors"] if t["name"] == tensor_name]
    return info["storages"][tensor["storage"]]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def mapped_ranges(path):
    """[(start, end)] of this process's mappings of the file `path` (from /proc/self/maps)."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                out.append((start, end))
    return out


def tensors_in(obj):
    """Every tensor of a (nested) loaded object, in order, repeats included."""
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return out


def storage_ptrs(obj):
    """data_ptr of the storage of every tensor found in a (nested) loaded object."""
    return {t.untyped_storage().data_ptr() for t in tensors_in(obj)}


def rewrite_pickle(src, dst, transform):
    """Copies the torch zip `src` to `dst` (Python's zipfile, STORED) with its data.pkl
    replaced by transform(data.pkl bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                data = transform(data)
            zout.writestr(info.filename, data)


class CallsGlobal:
    """Pickles as a call of module.name(arg): what a hostile checkpoint holds."""

    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


def save_hostile(path, module, name, arg, legacy=False):
    """A torch.save file whose pickle calls the global `module.name(arg)` next to a real tensor.
    Written with a stand-in global (print), then the GLOBAL opcode is rewritten as
    `module name` (protocol 2: newline-terminated, no frame lengths to fix)."""
    obj = {"weight": torch.arange(6.0).reshape(2, 3), "payload": CallsGlobal(print, arg)}
    stand_in = b"c__builtin__\nprint\n"  # protocol 2 writes builtins under its Python 2 name
    hostile = f"c{module}\n{name}\n".encode()
    if legacy:
        tmp = path + ".tmp"
        torch.save(obj, tmp, _use_new_zipfile_serialization=False, pickle_protocol=2)
        with open(tmp, "rb") as f:
            data = f.read()
        os.remove(tmp)
        assert data.count(stand_in) == 1
        with open(path, "wb") as f:
            f.write(data.replace(stand_in, hostile))
        return
    tmp = path + ".tmp"
    torch.save(obj, tmp, pickle_protocol=2)

    def swap(pkl):
        assert pkl.count(stand_in) == 1
        return pkl.replace(stand_in, hostile)

    rewrite_pickle(tmp, path, swap)
    os.remove(tmp)


def save_converted(obj, folder, name, allow_globals=(), **save_kwargs):
    """torch.save(obj) as folder/name.pt, converted to folder/name.zckpt (allow_globals: the
    test's own classes the conversion may keep); returns both paths."""
    import zckpt

    pt = os.path.join(str(folder), name + ".pt")
    torch.save(obj, pt, **save_kwargs)
    dst = os.path.join(str(folder), name + ".zckpt")
    zckpt.convert(pt, dst, allow_globals=allow_globals)
    return pt, dst


class Config:
    """A custom class inside a checkpoint: not on torch's weights_only allowlist."""

    def __init__(self, name, layers):
        self.name, self.layers = name, layers

    def __eq__(self, other):
        return type(other) is Config and (self.name, self.layers) == (other.name, other.layers)


def touch(path):
    """A harmless global with a visible effect: unpickling a call of it creates `path`."""
    with open(path, "w") as f:
        f.write("ran")
    return path
