"""Writes torch.save files into OUTDIR, each with its data.pkl pulled out of the zip and what
the C++ interpreter must find in it, as torch itself reports it.

For every case NAME:
  NAME.pt       the torch.save output
  NAME.pkl      its data.pkl (read with Python's zipfile)
  NAME.expect   tab-separated lines:
    STORAGE key nbytes location            one per data/<key> record (nbytes = record size)
    TENSOR name dtype shape stride offset group requires_grad is_param conj neg kind
                                           shape/stride comma-separated ("-" when empty);
                                           group: equal for tensors sharing a storage;
                                           kind: plain | quantized | dtensor | sharded
    EXTRA name json-fragment              must occur in the tensor's `extra`
    NUMPY path dtype shape scalar
    OPAQUE name count
    ONLY_LISTED_TENSORS 0|1               1: no tensors beyond the TENSOR lines
Usage: make_torch_fixtures.py OUTDIR
"""
import collections
import json
import os
import random
import sys
import tempfile
import zipfile

import numpy as np
import torch

# Shell dtypes torch cannot save, and bcomplex32 (torch 2.15), which zckpt's dtype table does not
# have yet: it gets a case of its own.
SKIP_DTYPES = {"bcomplex32", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
               "int1", "int2", "int3", "int4", "int5", "int6", "int7"}


def csv(xs):
    xs = list(xs)
    return ",".join(str(int(x)) for x in xs) if xs else "-"


def dtype_name(dt):
    return str(dt).replace("torch.", "")


class Expect:
    def __init__(self):
        self.lines = []
        self.groups = {}

    def group(self, t):
        key = t.untyped_storage()._cdata
        return self.groups.setdefault(key, len(self.groups))

    def tensor(self, name, t, is_param=False, kind="plain", requires_grad=None):
        rg = t.requires_grad if requires_grad is None else requires_grad
        self.lines.append("\t".join([
            "TENSOR", name, dtype_name(t.dtype), csv(t.shape), csv(t.stride()), str(t.storage_offset()),
            str(self.group(t)), str(int(rg)), str(int(is_param)), str(int(t.is_conj())), str(int(t.is_neg())), kind]))

    def extra(self, name, fragment):
        self.lines.append("EXTRA\t%s\t%s" % (name, fragment))


def walk(obj, path, ex, seen):
    """Mirrors the C++ naming: dict keys and sequence indices joined with '.'."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, torch.Tensor):
        # A tensor reached twice (the pickle memo shares it) is listed under both paths.
        name = path or "tensor"
        is_param = isinstance(obj, torch.nn.Parameter)
        if isinstance(obj, DTensor):
            local = obj._local_tensor
            ex.tensor(name, local, is_param=is_param, kind="dtensor", requires_grad=obj.requires_grad)
            ex.extra(name, '"global_shape":' + json.dumps(list(obj.shape)).replace(" ", ""))
            ex.extra(name, '"global_stride":' + json.dumps(list(obj.stride())).replace(" ", ""))
            for p in obj.placements:
                if p.is_shard():
                    ex.extra(name, '{"type":"Shard","dim":%d}' % p.dim)
                elif p.is_replicate():
                    ex.extra(name, '{"type":"Replicate"}')
            ex.extra(name, '"mesh_shape":' + json.dumps(list(obj.device_mesh.shape)).replace(" ", ""))
            if obj.device_mesh.mesh_dim_names:
                ex.extra(name, '"mesh_dim_names":' + json.dumps(list(obj.device_mesh.mesh_dim_names)).replace(" ", ""))
        elif obj.is_quantized:
            ex.tensor(name, obj, kind="quantized")
            if obj.qscheme() == torch.per_tensor_affine:
                ex.extra(name, '"qscheme":"per_tensor_affine"')
                ex.extra(name, '"scale":' + json.dumps(obj.q_scale()))
                ex.extra(name, '"zero_point":%d' % obj.q_zero_point())
            else:
                ex.extra(name, '"qscheme":"%s"' % str(obj.qscheme()).replace("torch.", ""))
                ex.extra(name, '"axis":%d' % obj.q_per_channel_axis())
                ex.tensor(name + ".scales", obj.q_per_channel_scales())
                ex.tensor(name + ".zero_points", obj.q_per_channel_zero_points())
        else:
            ex.tensor(name, obj, is_param=is_param)
        return
    if isinstance(obj, np.ndarray):
        ex.lines.append("NUMPY\t%s\t%s\t%s\t0" % (path, obj.dtype.str, csv(obj.shape)))
        return
    if isinstance(obj, np.generic):
        ex.lines.append("NUMPY\t%s\t%s\t-\t1" % (path, obj.dtype.str))
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            walk(v, (path + "." if path else "") + str(k), ex, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk(v, (path + "." if path else "") + str(i), ex, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        # A plain object: its attributes (BUILD state) sit under its own path.
        for k, v in vars(obj).items():
            walk(v, (path + "." if path else "") + k, ex, seen)


def save_case(out, name, obj, extra_lines=(), only_listed=True, location="cpu", **save_kwargs):
    pt = os.path.join(out, name + ".pt")
    torch.save(obj, pt, **save_kwargs)
    ex = Expect()
    walk(obj, "", ex, set())
    with zipfile.ZipFile(pt) as z:
        names = z.namelist()
        prefix = names[0].split("/")[0]
        with open(os.path.join(out, name + ".pkl"), "wb") as f:
            f.write(z.read(prefix + "/data.pkl"))
        for n in names:
            if n.startswith(prefix + "/data/"):
                ex.lines.append("STORAGE\t%s\t%d\t%s" % (n[len(prefix) + 6:], z.getinfo(n).file_size, location))
    ex.lines.extend(extra_lines)
    ex.lines.append("ONLY_LISTED_TENSORS\t%d" % int(only_listed))
    with open(os.path.join(out, name + ".expect"), "w") as f:
        f.write("\n".join(ex.lines) + "\n")


def all_dtypes():
    out = {}
    for name in dir(torch):
        dt = getattr(torch, name)
        if not isinstance(dt, torch.dtype) or dtype_name(dt) in SKIP_DTYPES or dtype_name(dt).startswith("q"):
            continue
        try:
            t = torch.empty(3, dtype=dt)
            if dt.is_floating_point or dt.is_complex or dt == torch.bool or "int" in dtype_name(dt):
                try:
                    t = torch.zeros(3, dtype=dt)
                except Exception:
                    pass
            out[dtype_name(dt)] = t
        except Exception:
            pass
    return out


def dtensor_cases(out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    init = "file://" + os.path.join(tempfile.mkdtemp(), "pg")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=init)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    w = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(3), mesh, [Replicate()])
    p = torch.nn.Parameter(distribute_tensor(torch.ones(2, 2), mesh, [Shard(1)]))
    save_case(out, "dtensor", {"layer.weight": w, "layer.bias": b, "param": p}, only_listed=False)
    sharded_cases(out)
    dist.destroy_process_group()


def sharded_cases(out):
    from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards
    from torch.distributed._shard.sharded_tensor import api

    local = torch.arange(6.0).reshape(2, 3)
    st = init_from_local_shards([Shard(local, ShardMetadata([0, 0], [2, 3], "rank:0/cpu"))], [2, 3])
    extras = ['EXTRA\tst\t"global_shape":[2,3]', 'EXTRA\tst\t"shard_offsets":[0,0]',
              'EXTRA\tst\t"shard_sizes":[2,3]', 'EXTRA\tst\t"placement":"rank:0/cpu"']
    # As torch writes it: the nested ProcessGroupState class pickles as `__builtin__ getattr`,
    # which the interpreter refuses.
    torch.save({"st": st}, os.path.join(out, "sharded_real.pt"))
    with zipfile.ZipFile(os.path.join(out, "sharded_real.pt")) as z:
        with open(os.path.join(out, "sharded_real.pkl"), "wb") as f:
            f.write(z.read(z.namelist()[0].split("/")[0] + "/data.pkl"))
    # With the nested class exposed at module level it pickles as a plain GLOBAL.
    cls = api.ShardedTensor.ProcessGroupState
    cls.__qualname__ = "ProcessGroupState"
    api.ProcessGroupState = cls
    ex = Expect()
    ex.tensor("st", local, kind="sharded")
    lines = [l for l in ex.lines] + extras
    pt = os.path.join(out, "sharded.pt")
    torch.save({"st": st}, pt)
    with zipfile.ZipFile(pt) as z:
        prefix = z.namelist()[0].split("/")[0]
        with open(os.path.join(out, "sharded.pkl"), "wb") as f:
            f.write(z.read(prefix + "/data.pkl"))
        for n in z.namelist():
            if n.startswith(prefix + "/data/"):
                lines.append("STORAGE\t%s\t%d\tcpu" % (n[len(prefix) + 6:], z.getinfo(n).file_size))
    lines.append("ONLY_LISTED_TENSORS\t1")
    with open(os.path.join(out, "sharded.expect"), "w") as f:
        f.write("\n".join(lines) + "\n")


class Custom:
    """A user class: an opaque global whose state holds a tensor."""

    def __init__(self):
        self.t = torch.ones(2)
        self.n = 3


def cuda_location_case(out):
    """A shard whose storages say cuda:0, written on a CPU-only machine by faking the tag."""
    import torch.serialization as ser

    original = ser.location_tag
    ser.location_tag = lambda storage: "cuda:0"
    try:
        save_case(out, "cuda_location", {"w": torch.ones(2, 3), "b": torch.zeros(3)}, location="cuda:0")
    finally:
        ser.location_tag = original


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)

    save_case(out, "dtypes", all_dtypes())
    if hasattr(torch, "bcomplex32"):
        save_case(out, "bcomplex32", {"z": torch.zeros(2, dtype=torch.bcomplex32)})

    base = torch.arange(24.0).reshape(4, 6)
    lin = torch.nn.Linear(3, 3)
    views = {
        "base": base,
        "transposed": base.t(),
        "row": base[1],
        "column": base[:, 2],
        "strided": base[::2, 1::3],
        "tied_a": lin.weight,
        "tied_b": lin.weight,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "empty_offset": base[4:],
        "expanded": torch.ones(3).expand(2, 3),
        "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "neg": torch._neg_view(torch.tensor([1.0, 2.0])),
        "param": torch.nn.Parameter(torch.ones(2)),
        "param_frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "requires_grad": torch.ones(2, requires_grad=True),
    }
    save_case(out, "views", views)

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model[2].register_buffer("running", torch.zeros(2))
    save_case(out, "state_dict", model.state_dict(),
              extra_lines=["RENDER_CONTAINS\tOrderedDict({'0.weight': "])

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        loss = model(torch.randn(5, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_case(out, "optimizer", opt.state_dict())

    rng = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate(),
           "np_scalar": np.float32(1.5), "np_matrix": np.arange(6, dtype=np.int16).reshape(2, 3)}
    save_case(out, "rng", {"rng": rng}, extra_lines=["OPAQUE_NONE\t1"])

    proto_obj = {"a": torch.arange(5), "b": [torch.ones(2, 2, dtype=torch.float16), b"raw\xff"],
                 "bf": torch.ones(3, dtype=torch.bfloat16)}
    for proto in (2, 4, 5):
        save_case(out, "proto%d" % proto, proto_obj, pickle_protocol=proto)

    with_warn = torch.quantize_per_tensor(torch.tensor([1.0, 2.0, 3.0]), 0.1, 3, torch.quint8)
    per_channel = torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2], dtype=torch.double),
                                             torch.tensor([0, 1]), 0, torch.qint8)
    save_case(out, "quantized", {"q": with_warn, "qc": per_channel})

    save_case(out, "opaque", {"obj": Custom(), "obj2": Custom()}, extra_lines=["OPAQUE\t__main__.Custom\t2"])
    save_case(out, "bare_tensor", torch.arange(4).reshape(2, 2))

    cuda_location_case(out)
    dtensor_cases(out)
    print("ok")


if __name__ == "__main__":
    main()
