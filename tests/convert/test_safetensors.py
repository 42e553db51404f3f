"""safetensors in and out, end to end, on files the `safetensors` package writes during the run.

`zckpt convert x.safetensors` -> `zckpt.load` returns what `safetensors.torch.load_file` returns
(same keys in the same order, dtypes, shapes, bytes), the C++ object tree holds the same,
`zckpt export --format safetensors` gives the file back byte for byte, `zckpt export` (to .pt)
gives the torch.save file of that dict (its data.pkl byte-identical to torch.save's), and a
container converted from a torch.save file of a flat dict exports to exactly what
`safetensors.torch.save_file` writes. Malformed headers are refused with exit 1 and nothing
written."""
from __future__ import annotations

import json
import os
import struct
import sys
import warnings
import zipfile

import pytest
import torch

zckpt_py = pytest.importorskip("zckpt")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from conftest import assert_nothing_written  # noqa: E402

warnings.simplefilter("ignore", UserWarning)

# Every dtype safetensors.torch.save_file writes (F4 is torch's float4_e2m1fn_x2, its last
# dimension counted twice in the header), and random bytes of a dtype: shared with the C++
# suite's fixture writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "safetensors"))
from make_fixtures import DTYPES, tensor as random_tensor  # noqa: E402


def raw(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def assert_same_dict(got, want):
    assert list(got) == list(want)
    for k in want:
        g, w = got[k], want[k]
        assert type(g) is torch.Tensor, (k, type(g))
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), k
        assert g.is_contiguous(), k
        assert raw(g) == raw(w), k


SOURCES = {
    "every_dtype": (lambda: {f"t.{str(dt)[6:]}": random_tensor(dt, [3, 4], i) for i, dt in enumerate(DTYPES)},
                    {"format": "pt"}),
    "edges": (lambda: {"empty": torch.zeros(0, 4), "empty2": torch.zeros(2, 0, dtype=torch.int64),
                       "scalar": torch.tensor(2.5, dtype=torch.float64), "one": torch.ones(1, dtype=torch.bfloat16),
                       "names/with.odd \u00e9\tchars": torch.arange(3, dtype=torch.int16),
                       # keys the pickle interpreter names otherwise ("" is "tensor", which moves
                       # the real "tensor" to "tensor~1"): nothing may go by those names
                       "": torch.ones(2, dtype=torch.int8), "tensor": torch.zeros(3, dtype=torch.int8)},
              {"a": "1", "b": "two", "c": "x\ny"}),
    # Tensors over several 4 KiB chunks (the test converts with --chunk-bytes 4096).
    "chunked": (lambda: {f"layer.{i}.w": random_tensor(torch.float32, [33, 65], i) for i in range(12)}, None),
    "nothing": (lambda: {}, None),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{name: (path, the dict saved)}: written by safetensors itself."""
    root = tmp_path_factory.mktemp("st")
    out = {}
    for name, (make, metadata) in SOURCES.items():
        tensors = make()
        path = root / f"{name}.safetensors"
        save_file(tensors, path, metadata=metadata)
        out[name] = (path, tensors)
    return out


@pytest.fixture(scope="module")
def converted(sources, zckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("st_converted")
    out = {}
    for name, (path, _) in sources.items():
        dst = root / f"{name}.zckpt"
        options = ["--chunk-bytes", "4096"] if name == "chunked" else []
        run = zckpt.ok("convert", "--quiet", *options, path, "-o", dst)
        assert run.out == "" and run.err == ""
        out[name] = dst
    return out


def buffer_order(path):
    """The tensor names in the order of their bytes in the file (header order for ties)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return [k for k, _ in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))]


@pytest.mark.parametrize("name", list(SOURCES))
def test_load_returns_what_load_file_returns(name, sources, converted, zckpt):
    path, saved = sources[name]
    zckpt.ok("verify", converted[name])
    got = zckpt_py.load(converted[name])
    assert type(got) is dict
    want = load_file(path)
    assert list(want) == buffer_order(path)
    assert_same_dict(got, want)
    assert_same_dict(got, {k: saved[k] for k in buffer_order(path)})  # and what was saved
    # mmap=True views the same bytes
    assert_same_dict(zckpt_py.load(converted[name], mmap=True), want)


@pytest.mark.parametrize("name", list(SOURCES))
def test_cpp_object_tree_is_the_same_dict(name, sources, converted):
    tree = zckpt_py._C.load_tree(str(converted[name]))
    assert_same_dict(tree, zckpt_py.load(converted[name]))


@pytest.mark.parametrize("name", list(SOURCES))
def test_export_gives_the_file_back_byte_for_byte(name, sources, converted, zckpt, tmp_path):
    back = tmp_path / "back.safetensors"
    zckpt.ok("export", converted[name], "-o", back)  # format from the extension
    assert back.read_bytes() == sources[name][0].read_bytes()
    again = tmp_path / "again.st"
    zckpt.ok("export", "--format", "safetensors", converted[name], "-o", again)
    assert again.read_bytes() == back.read_bytes()
    py = tmp_path / "py.safetensors"
    zckpt_py.export(converted[name], py)
    assert py.read_bytes() == back.read_bytes()


@pytest.mark.parametrize("name", list(SOURCES))
def test_export_to_pt_is_torch_save_of_the_dict(name, sources, converted, zckpt, tmp_path):
    back = tmp_path / "back.pt"
    zckpt.ok("export", converted[name], "-o", back)
    loaded = torch.load(back, weights_only=True)
    assert_same_dict(loaded, zckpt_py.load(converted[name]))
    # The kept pickle is torch.save's own for that dict, byte for byte.
    ref = tmp_path / "ref.pt"
    torch.save(zckpt_py.load(converted[name]), ref)
    with zipfile.ZipFile(back) as a, zipfile.ZipFile(ref) as b:
        assert a.read("archive/data.pkl") == b.read("ref/data.pkl")


def test_metadata_is_kept_and_listed(sources, converted, zckpt):
    ls = zckpt.ls(converted["edges"])
    meta = ls["metadata"]
    assert meta["zckpt.source.format"] == "safetensors"
    assert json.loads(meta["zckpt.source.metadata"]) == {"a": "1", "b": "two", "c": "x\ny"}
    assert "zckpt.source.metadata" not in zckpt.ls(converted["chunked"])["metadata"]
    with safe_open(sources["edges"][0], framework="pt") as f:
        assert f.metadata() == json.loads(meta["zckpt.source.metadata"])


def test_a_thousand_tensors_pickle_like_torch(zckpt, tmp_path):
    """Past Python's 1000-item SETITEMS batches and 256 memo slots: still torch.save's bytes."""
    tensors = {f"p.{i}": torch.full((2,), float(i), dtype=torch.float16 if i % 3 else torch.uint16) for i in range(1100)}
    src, dst, back, ref = tmp_path / "m.safetensors", tmp_path / "m.zckpt", tmp_path / "m.pt", tmp_path / "ref.pt"
    save_file(tensors, src)
    zckpt.ok("convert", "--quiet", src, "-o", dst)
    zckpt.ok("export", dst, "-o", back)
    torch.save(load_file(src), ref)
    with zipfile.ZipFile(back) as a, zipfile.ZipFile(ref) as b:
        assert a.read("archive/data.pkl") == b.read("ref/data.pkl")
    assert_same_dict(zckpt_py.load(dst), load_file(src))


# ---- .pt -> .safetensors ----------------------------------------------------------------------

def test_pt_of_a_flat_dict_exports_as_save_file_writes_it(zckpt, tmp_path):
    state = {f"t.{str(dt)[6:]}": random_tensor(dt, [2, 6], i) for i, dt in enumerate(DTYPES)}
    state.update({"zero": torch.zeros(0, 3), "scalar": torch.tensor(1.0), "b.10": torch.ones(2), "b.9": torch.ones(2),
                  "": torch.ones(1), "tensor": torch.zeros(1),
                   "view": torch.arange(20, dtype=torch.float32)[5:15]})  # a view of a larger storage
    pt, z, out, ref = tmp_path / "s.pt", tmp_path / "s.zckpt", tmp_path / "s.safetensors", tmp_path / "ref.safetensors"
    torch.save(state, pt)
    zckpt.ok("convert", "--quiet", pt, "-o", z)
    zckpt.ok("export", z, "-o", out)
    save_file(torch.load(pt), ref)
    assert out.read_bytes() == ref.read_bytes()
    # An nn.Module state_dict (an OrderedDict with _metadata) too.
    lin = torch.nn.Linear(3, 2)
    torch.save(lin.state_dict(), pt)
    zckpt.ok("convert", "--quiet", "--force", pt, "-o", z)
    zckpt.ok("export", "--force", z, "-o", out)
    save_file(lin.state_dict(), ref)
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("obj,why", [
    (lambda: {"w": torch.ones(2), "step": 3}, "the value of 'step' is not a tensor"),
    (lambda: {"model": {"w": torch.ones(2)}}, "the value of 'model' is not a tensor"),
    (lambda: [torch.ones(2)], "not a dict of tensors"),
    (lambda: (lambda t: {"a": t, "b": t})(torch.ones(3)), "share memory"),
    (lambda: (lambda t: {"a": t, "b": t[1:]})(torch.ones(3)), "share memory"),
    (lambda: {"t": torch.ones(3, 4).t()}, "not contiguous"),
    (lambda: {"c": torch.ones(2, dtype=torch.complex128)}, "complex128, which safetensors has no type for"),
])
def test_what_safetensors_cannot_hold_is_refused(obj, why, zckpt, tmp_path):
    pt, z, out = tmp_path / "x.pt", tmp_path / "x.zckpt", tmp_path / "x.safetensors"
    torch.save(obj(), pt)
    zckpt.ok("convert", "--quiet", pt, "-o", z)
    run = zckpt("export", z, "-o", out)
    assert run.rc == 2, run.text
    assert "cannot be written as safetensors" in run.err and why in run.err, run.err
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["x.pt", "x.zckpt"]


# ---- malformed headers through the command line ------------------------------------------------

def _file(header: bytes, data: bytes = b"", declared=None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header + data


F32 = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
MALFORMED = {
    "overlapping_offsets": (_file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                  b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12)), 1, "overlap"),
    "size_past_end": (_file(b"{" + F32 + b"}", bytes(4)), 1, "runs past the end of the file"),
    "bad_json": (_file(b'{"a":{"dtype":', bytes(8)), 1, "not valid JSON"),
    "huge_header_length": (_file(b"{}", declared=1 << 62), 1, "exceeds safetensors' limit"),
    "duplicate_keys": (_file(b"{" + F32 + b"," + F32 + b"}", bytes(8)), 1, "appears twice"),
    "not_utf8": (_file(b'{"\xff\xfe":{}}'), 1, "not UTF-8"),
    "gap": (_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)), 1, "gap"),
    "unknown_dtype": (_file(b'{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}', bytes(1)), 2, "does not define"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_header_is_refused_and_nothing_written(name, zckpt, tmp_path):
    data, rc, fragment = MALFORMED[name]
    src = tmp_path / "in" / "bad.safetensors"
    src.parent.mkdir()
    src.write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    run = zckpt("convert", src, "-o", out / "bad.zckpt")
    assert run.rc == rc, run.text
    assert str(src) in run.err and fragment in run.err, run.err
    assert_nothing_written(out, name)
    with pytest.raises(zckpt_py.ZckptError, match="safetensors header"):
        zckpt_py.convert(src, out / "py.zckpt")
    assert_nothing_written(out, name)


def test_load_of_a_safetensors_file_says_convert_first(sources):
    path = sources["edges"][0]
    with pytest.raises(zckpt_py.ZckptError, match=r"safetensors file, not a zckpt container: convert it first"):
        zckpt_py.load(path)
