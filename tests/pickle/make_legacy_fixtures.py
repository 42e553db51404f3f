"""Writes legacy-format torch files (torch.save(..., _use_new_zipfile_serialization=False))
into OUTDIR, with their layout as an independent reader sees it and the bytes torch holds for
each storage.

For every case NAME:
  NAME.pt       the file
  NAME.expect   tab-separated lines:
    HEADER object_offset object_size keys_offset keys_size header_end data_end
    LSTORAGE key storage_type numel count_offset data_offset nbytes location
    TENSOR name dtype shape stride offset storage_key
  NAME.<key>.bin   the storage's bytes as torch holds them in memory
`views` is written by hand with storage views (a sixth persistent-id element that only
pre-0.4 torch wrote), then loaded with torch.load to check it means what it should.
Usage: make_legacy_fixtures.py OUTDIR
"""
import collections
import io
import os
import pickle
import struct
import sys
import warnings

import torch

warnings.filterwarnings("ignore")


def csv(xs):
    xs = list(xs)
    return ",".join(str(int(x)) for x in xs) if xs else "-"


class StorageType:
    def __init__(self, module, name):
        self.path = module + "." + name
        self.name = name


class LayoutReader(pickle.Unpickler):
    """Reads pickles without building any torch object; records storage persistent ids."""

    def __init__(self, f, pids):
        super().__init__(f)
        self.pids = pids

    def persistent_load(self, pid):
        self.pids.append(pid)
        return None

    def find_class(self, module, name):
        if name.endswith("Storage"):
            return StorageType(module, name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return lambda *args, **kwargs: None


def element_size(storage_type):
    if storage_type.name == "UntypedStorage":
        return 1
    return getattr(torch, storage_type.name)(0).element_size()


def layout_lines(path):
    lines = []
    with open(path, "rb") as f:
        for _ in range(3):
            pickle.load(f)
        object_offset = f.tell()
        pids = []
        LayoutReader(f, pids).load()
        keys_offset = f.tell()
        keys = pickle.load(f)
        header_end = f.tell()
        roots = {}
        for pid in pids:
            roots.setdefault(pid[2], pid)
        storages = []
        for key in keys:
            _, stype, _, location, numel = roots[key][:5]
            count_offset = f.tell()
            (count,) = struct.unpack("<q", f.read(8))
            assert count == numel, (count, numel)
            nbytes = count * element_size(stype)
            storages.append("LSTORAGE\t%s\t%s\t%d\t%d\t%d\t%d\t%s" % (
                key, stype.path, count, count_offset, f.tell(), nbytes, location))
            f.seek(nbytes, 1)
        lines.append("HEADER\t%d\t%d\t%d\t%d\t%d\t%d" % (
            object_offset, keys_offset - object_offset, keys_offset, header_end - keys_offset, header_end, f.tell()))
    return lines + storages


def write_case(out, name, tensors, tensor_lines=None, **save_kwargs):
    path = os.path.join(out, name + ".pt")
    if tensor_lines is None:
        torch.save(tensors, path, _use_new_zipfile_serialization=False, **save_kwargs)
        tensor_lines = []
        for tname, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                continue
            key = str(t.untyped_storage()._cdata)
            tensor_lines.append("TENSOR\t%s\t%s\t%s\t%s\t%d\t%s" % (
                tname, str(t.dtype).replace("torch.", ""), csv(t.shape), csv(t.stride()), t.storage_offset(), key))
            with open(os.path.join(out, "%s.%s.bin" % (name, key)), "wb") as f:
                f.write(bytes(t.untyped_storage()))
    with open(os.path.join(out, name + ".expect"), "w") as f:
        f.write("\n".join(layout_lines(path) + tensor_lines) + "\n")


class StorageRef:
    def __init__(self, pid):
        self.pid = pid


class RebuildV2:
    """Pickles as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


def write_views(out):
    """A file with storage views, as torch < 0.4 wrote them, following _legacy_save."""
    base = torch.arange(10, dtype=torch.float32)
    longs = torch.tensor([7, 8, 9], dtype=torch.int64)
    root_f = ("storage", torch.FloatStorage, "1000", "cpu", 10, None)
    view_f = ("storage", torch.FloatStorage, "1000", "cpu", 10, ("2000", 4, 4))
    view_l = ("storage", torch.LongStorage, "3000", "cpu", 3, ("4000", 1, 2))
    obj = {
        "whole": RebuildV2(StorageRef(root_f), 0, (10,), (1,)),
        "view": RebuildV2(StorageRef(view_f), 1, (3,), (1,)),
        "view2": RebuildV2(StorageRef(view_f), 0, (2, 2), (2, 1)),
        "lview": RebuildV2(StorageRef(view_l), 0, (2,), (1,)),
    }
    buf = io.BytesIO()
    sys_info = dict(protocol_version=1001, little_endian=True, type_sizes=dict(short=2, int=4, long=4))
    for header in (0x1950A86A20F9469CFC6C, 1001, sys_info):
        pickle.dump(header, buf, protocol=2)
    pickler = pickle.Pickler(buf, protocol=2)
    pickler.persistent_id = lambda o: o.pid if isinstance(o, StorageRef) else None
    pickler.dump(obj)
    pickle.dump(["1000", "3000"], buf, protocol=2)
    for t in (base, longs):
        buf.write(struct.pack("<q", t.numel()))
        buf.write(bytes(t.untyped_storage()))
    path = os.path.join(out, "views.pt")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    # torch's own legacy loader must read it as intended.
    loaded = torch.load(path, weights_only=False)
    assert torch.equal(loaded["whole"], base)
    assert torch.equal(loaded["view"], base[5:8]), loaded["view"]
    assert torch.equal(loaded["view2"], base[4:8].reshape(2, 2)), loaded["view2"]
    assert torch.equal(loaded["lview"], longs[1:3]), loaded["lview"]
    for key, t in (("1000", base), ("3000", longs)):
        with open(os.path.join(out, "views.%s.bin" % key), "wb") as f:
            f.write(bytes(t.untyped_storage()))
    write_case(out, "views", None, [
        "TENSOR\twhole\tfloat32\t10\t1\t0\t1000",
        "TENSOR\tview\tfloat32\t3\t1\t5\t1000",
        "TENSOR\tview2\tfloat32\t2,2\t2,1\t4\t1000",
        "TENSOR\tlview\tint64\t2\t1\t1\t3000",
    ])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    a = torch.arange(6.0)
    lin = torch.nn.Linear(2, 2)
    write_case(out, "basic", {
        "a": a,
        "slice": a[2:5],
        "again": a.view(2, 3),
        "long": torch.arange(4, dtype=torch.int64).reshape(2, 2),
        "half_t": torch.ones(2, 3, dtype=torch.float16).t(),
        "f8": torch.zeros(5, dtype=torch.float8_e4m3fn),
        "u16": torch.zeros(3, dtype=torch.uint16),
        "bool": torch.tensor([True, False]),
        "empty": torch.empty(0),
        "param": lin.weight,
        "scalar": torch.tensor(2.5),
    })
    write_case(out, "no_tensors", {"x": 1, "y": "two"})
    write_case(out, "proto4", {"t": torch.ones(2), "u": torch.zeros(3, dtype=torch.int8)}, pickle_protocol=4)
    write_views(out)
    print("ok")


if __name__ == "__main__":
    main()
