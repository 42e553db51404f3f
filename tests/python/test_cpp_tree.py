"""The C++ API's object tree (zckpt::Load(...).tree, zckpt::Map(...).tree) against torch.load.

libzckpt builds the tree with zckpt's own restricted interpreter, not torch's unpickler, and
maps Python objects onto LibTorch values as include/zckpt/loader.h (TensorSet::tree) documents.
`_C.load_tree` hands that IValue tree to Python keeping sharing (one Python object per IValue
object). Each torch-written file of the family is converted, its tree compared with torch.load
of the original projected through the documented mapping: values bit for bit, dtype, shape,
strides, storage offsets, conj/neg, which tensors share a storage and which are the same object.
"""
import collections
import math
import sys

import numpy as np
import pytest
import torch

import torch_family
import zckpt
from torch_family import diff
from zckpt import _C

INT64 = (-(1 << 63), (1 << 63) - 1)


class Opaque:
    """Stands for an object the tree describes rather than builds ({"__class__": ...})."""

    __slots__ = ()

    def __eq__(self, other):
        return type(other) is Opaque

    def __hash__(self):
        return 0

    def __repr__(self):
        return "<opaque>"


OPAQUE = Opaque()


def _text(b):
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError:
        return bytes(b)


# The projected lists that stand for a set or frozenset, by id (each kept alive here, so no other
# list can take its id): a set's items are pickled in the saving process's hash order
# (PYTHONHASHSEED), which the loading process does not share.
_FROM_SETS = {}


def sets_sorted(got, expected, seen=None):
    """Sorts (by repr, as project sorts a set's items) each list of `got` that stands where
    `expected` has a projected set; returns `got`."""
    seen = set() if seen is None else seen
    if id(expected) in seen:
        return got
    seen.add(id(expected))
    if isinstance(expected, list) and isinstance(got, list):
        if _FROM_SETS.get(id(expected)) is expected:
            got.sort(key=repr)
        for g, e in zip(got, expected):
            sets_sorted(g, e, seen)
    elif isinstance(expected, tuple) and isinstance(got, tuple):
        for g, e in zip(got, expected):
            sets_sorted(g, e, seen)
    elif isinstance(expected, dict) and isinstance(got, dict):
        for k, e in expected.items():
            if k in got:
                sets_sorted(got[k], e, seen)
    return got


def project(obj, memo=None):
    """What TensorSet::tree holds for what torch.load returned, under the documented mapping."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    out = _project(obj, memo)
    memo[id(obj)] = out
    return out


def _project(obj, memo):
    # Exact types: numpy's float64 is a float, but pickles as a numpy object.
    if obj is None or type(obj) in (bool, float, str):
        return obj
    if type(obj) is int:
        return obj if INT64[0] <= obj <= INT64[1] else str(obj)
    if type(obj) in (bytes, bytearray):
        return _text(obj)
    if torch_family.is_sharded(obj):  # its (one) local shard
        return project(torch_family.local_of(obj), memo)
    if torch_family.is_dtensor(obj):  # its local tensor, requiring grad as the DTensor did
        local = obj._local_tensor.detach()
        return local.requires_grad_(obj.requires_grad) if obj.requires_grad else local
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.layout != torch.strided or obj.is_nested or obj.is_quantized:
            return OPAQUE
        if obj.device.type == "meta" or type(obj) not in (torch.Tensor, torch.nn.Parameter):
            return OPAQUE
        t = obj.detach()
        return t.requires_grad_(obj.requires_grad) if obj.requires_grad else t
    if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
        raw = obj.untyped() if isinstance(obj, torch.TypedStorage) else obj
        return torch.empty(0, dtype=torch.uint8).set_(raw)
    if isinstance(obj, torch.device):
        return obj
    if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
        return str(obj)
    if isinstance(obj, torch.Size):
        return tuple(project(x, memo) for x in obj)
    if isinstance(obj, dict) and type(obj) in (dict, collections.OrderedDict):
        out = {}
        memo[id(obj)] = out
        for k, v in obj.items():
            key = project(k, memo)
            out[key if type(key) in (str, int, float, bool) else repr(k)] = project(v, memo)
        return out
    if type(obj) is tuple:
        return tuple(project(x, memo) for x in obj)
    if type(obj) is list:
        out = []
        memo[id(obj)] = out
        out.extend(project(x, memo) for x in obj)
        return out
    if type(obj) in (set, frozenset):
        out = []
        memo[id(obj)] = out
        out.extend(sorted((project(x, memo) for x in obj), key=repr))
        _FROM_SETS[id(out)] = out
        return out
    return OPAQUE  # numpy values, complex numbers, modules, any other object


def opaque_described(tree):
    """Replaces the tree's object descriptions ({"__class__": ...}) with OPAQUE, checking each."""
    if isinstance(tree, dict):
        if "__class__" in tree:
            assert isinstance(tree["__class__"], str) and tree["__class__"], tree
            assert set(tree) <= {"__class__", "__args__", "__kwargs__", "__items__", "__entries__", "__state__"}, tree
            return OPAQUE
        for k in tree:
            tree[k] = opaque_described(tree[k])
    elif isinstance(tree, list):
        for i, x in enumerate(tree):
            tree[i] = opaque_described(x)
    elif isinstance(tree, tuple):
        return tuple(opaque_described(x) for x in tree)
    return tree


@pytest.fixture
def deep_recursion():
    """deep_nesting.pt nests 400 levels: more Python frames than the default limit allows."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    yield
    sys.setrecursionlimit(old)


# quantized: the quantizer lives in the pickle; Load refuses (LoadStorages + torch rebuild it).
REFUSED = {"quantized.pt"}
NAMES = [f.name for f in torch_family.FAMILY if f.name not in REFUSED and f.loads_as_saved in (True, False)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["load", "map"])
def test_tree_equals_torch_load(family, name, how, deep_recursion):
    path = family.zckpt(name)
    got = opaque_described(_C.load_tree(path, map=(how == "map")))
    expected = project(family.torch_load(name))
    d = diff(sets_sorted(got, expected), expected)
    assert d is None, d


def test_tree_keeps_python_shapes_and_sharing(tmp_path):
    w = torch.randn(4, 3)
    base = torch.arange(10.0)
    obj = collections.OrderedDict(
        a=w, b=w, view=base[2:5], base=base, p=torch.nn.Parameter(torch.ones(2)), frozen=torch.nn.Parameter(
            torch.ones(1), requires_grad=False), n=3, big=1 << 70, f=1.5, s="x", raw=b"\xff\x00", none=None,
        t=(1, [2, {3: "three"}]), st={7}, size=torch.Size([2, 3]), dev=torch.device("cuda", 1),
        dt=torch.bfloat16, ns=np.float32(2.0), c=1 + 2j)
    pt = tmp_path / "obj.pt"
    torch.save(obj, pt)
    tree = _C.load_tree(zckpt.convert(str(pt))["destination"])
    assert list(tree) == list(obj)
    assert tree["a"] is tree["b"] and torch.equal(tree["a"], w)
    assert tree["view"].untyped_storage().data_ptr() == tree["base"].untyped_storage().data_ptr()
    assert tree["view"].storage_offset() == 2 and tree["view"].tolist() == [2.0, 3.0, 4.0]
    assert type(tree["p"]) is torch.Tensor and tree["p"].requires_grad and not tree["frozen"].requires_grad
    assert tree["n"] == 3 and tree["big"] == str(1 << 70) and tree["f"] == 1.5 and tree["s"] == "x"
    assert tree["raw"] == b"\xff\x00" and tree["none"] is None
    assert tree["t"] == (1, [2, {3: "three"}]) and tree["st"] == [7] and tree["size"] == (2, 3)
    assert tree["dev"] == torch.device("cuda", 1) and tree["dt"] == "torch.bfloat16"
    assert tree["ns"]["__class__"] == "numpy.core.multiarray.scalar" or tree["ns"]["__class__"].startswith("numpy")
    assert tree["c"] == {"__class__": "builtins.complex", "__args__": (1.0, 2.0)}


def test_tree_cuts_cycles_and_keeps_memo(tmp_path):
    loop = [1]
    loop.append(loop)
    shared = {"k": torch.zeros(2)}
    pt = tmp_path / "cycle.pt"
    torch.save({"loop": loop, "x": shared, "y": shared}, pt)
    tree = _C.load_tree(zckpt.convert(str(pt))["destination"])
    assert tree["loop"] == [1, None]
    assert tree["x"] is tree["y"]


def test_tree_of_a_corrupt_object_pickle_is_an_error(tmp_path):
    import zckpt_testing

    pt = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, pt)
    dst = zckpt.convert(str(pt))["destination"]
    (blob,) = [b for b in zckpt_testing.ls_json(dst)["blobs"] if b["name"] == "data.pkl"]
    zckpt_testing.flip_byte(dst, blob["offset"] + 3)
    with pytest.raises(_C.CorruptError, match=r"data\.pkl.*checksum"):
        _C.load_tree(dst)


def test_tree_refuses_quantized_as_load_does(family):
    with pytest.raises(_C.ZckptError, match="quantized"):
        _C.load_tree(family.zckpt("quantized.pt"))


def test_projection_has_teeth():
    """The comparison notices a tree that differs from what torch.load gave."""
    w = torch.ones(2)
    assert diff(project({"a": w, "b": w}), {"a": w.clone(), "b": w.clone()}) is not None
    assert diff(project({"a": 1 << 70}), {"a": 1 << 70}) is not None
    assert diff(project({"a": (1, 2)}), {"a": [1, 2]}) is not None
    assert diff(project({"a": math.nan}), {"a": math.nan}) is None
