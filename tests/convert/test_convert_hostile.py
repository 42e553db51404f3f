"""Hostile and malformed `.pt` inputs to `zckpt convert`: every one is refused with exit 1 or 2 and
a message, never by a crash, and nothing (no destination, no temporary file) is left behind.
A pickle naming a code-running global is refused as unsafe (exit 1), naming the global and the
byte offset of the opcode that names it, and is never executed."""
from __future__ import annotations

import collections
import io
import os
import pickle
import random
import struct
import subprocess
import sys
import zipfile

import pytest
import torch
import torch._utils

from conftest import assert_nothing_written, rewrite_zip, zip_records
from torch_family import assert_deep_equal

STORAGE = torch.arange(16, dtype=torch.float32)  # data/0 of the base archive: 64 bytes


@pytest.fixture(scope="module")
def base_pt(tmp_path_factory):
    """A torch-written archive {'w': 16 f32}, whose records the forged files reuse."""
    path = tmp_path_factory.mktemp("base") / "base.pt"
    torch.save({"w": STORAGE.clone()}, path)
    assert list(zip_records(path))[:1] == ["data.pkl"] and "data/0" in zip_records(path)
    return path


def refuse(zckpt, src, out_dir, codes=(1, 2)):
    """Converts src into an empty out_dir; asserts a refusal with a message naming src, and that
    nothing was written. Returns the run."""
    os.makedirs(out_dir, exist_ok=True)
    run = zckpt("convert", "--quiet", src, "-o", os.path.join(out_dir, "out.zckpt"))
    assert run.rc in codes, f"exit {run.rc} (want {codes}):\n{run.text}"
    assert str(src) in run.err and len(run.err.strip()) > len(str(src)) + 10, run.err
    assert_nothing_written(out_dir, os.path.basename(src))
    return run


# ---- pickle assembly --------------------------------------------------------------------------


def binunicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def short_binunicode(s):
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def calling_pickle(module, name, arg, protocol):
    """data.pkl for {'w': 'ok', 'evil': module.name(arg)}, naming the global by GLOBAL
    (protocol 2) or STACK_GLOBAL (protocol 4). Returns (bytes, offset of that opcode)."""
    if protocol == 2:
        head = b"\x80\x02}" + binunicode("w") + binunicode("ok") + b"s" + binunicode("evil")
        opcode = b"c" + f"{module}\n{name}\n".encode()
        arg = binunicode(arg)
    else:
        head = (b"\x80\x04}" + short_binunicode("w") + short_binunicode("ok") + b"s" + short_binunicode("evil") +
                short_binunicode(module) + short_binunicode(name))
        opcode = b"\x93"
        arg = short_binunicode(arg)
    return head + opcode + arg + b"\x85Rs.", len(head)


class FakeStorage:
    def __init__(self, key, numel, cls="FloatStorage", location="cpu"):
        self.key, self.numel, self.cls, self.location = key, numel, cls, location


class FakeTensor:
    """Pickles as torch does (_rebuild_tensor_v2 over a storage persistent id), with any numbers."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


def forged_pickle(obj, protocol=2):
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=protocol)
    p.persistent_id = lambda o: (("storage", getattr(torch, o.cls), o.key, o.location, o.numel)
                                 if isinstance(o, FakeStorage) else None)
    p.dump(obj)
    return buf.getvalue()


def forged_pt(base_pt, path, obj=None, data_pkl=None, **kw):
    rewrite_zip(base_pt, path, replace={"data.pkl": data_pkl if data_pkl is not None else forged_pickle(obj)}, **kw)
    return path


# ---- code-running globals ---------------------------------------------------------------------

UNSAFE_GLOBALS = [
    ("os", "system"), ("posix", "system"), ("subprocess", "Popen"), ("builtins", "eval"), ("builtins", "exec"),
    ("builtins", "__import__"), ("builtins", "getattr"), ("runpy", "_run_code"), ("importlib", "import_module"),
    ("pickle", "loads"), ("__builtin__", "eval"),
]


@pytest.mark.parametrize("protocol", [2, 4], ids=["GLOBAL", "STACK_GLOBAL"])
@pytest.mark.parametrize("module,name", UNSAFE_GLOBALS, ids=[f"{m}.{n}" for m, n in UNSAFE_GLOBALS])
def test_unsafe_global_is_refused(module, name, protocol, base_pt, zckpt, tmp_path):
    data, offset = calling_pickle(module, name, "touch zckpt-marker", protocol)
    src = forged_pt(base_pt, tmp_path / "evil.pt", data_pkl=data)
    run = refuse(zckpt, src, tmp_path / "out", codes=(1,))
    assert f"refused global '{module}.{name}' at pickle byte offset {offset}" in run.err, run.err


@pytest.mark.parametrize("module,name", [("builtins", "set")])
def test_forged_archive_with_a_safe_global_converts(module, name, base_pt, zckpt, tmp_path):
    """Control for the test above: the same layout naming a harmless global converts."""
    data, _ = calling_pickle(module, name, "", 2)
    src = forged_pt(base_pt, tmp_path / "fine.pt", data_pkl=data)
    zckpt.ok("convert", "--quiet", src, "-o", tmp_path / "fine.zckpt")
    zckpt.ok("export", tmp_path / "fine.zckpt", "-o", tmp_path / "back.pt")
    assert torch.load(tmp_path / "back.pt", weights_only=False) == {"w": "ok", "evil": getattr(
        __import__(module), name)("")}


MARKER = "zckpt-marker"
MARKER_PAYLOADS = [
    ("os", "system", f"touch {MARKER}", 2),
    ("posix", "system", f"touch {MARKER}", 4),
    ("builtins", "exec", f"open({MARKER!r}, 'w').close()", 2),
    ("builtins", "exec", f"open({MARKER!r}, 'w').close()", 4),
]


@pytest.mark.parametrize("module,name,arg,protocol", MARKER_PAYLOADS,
                         ids=[f"{m}.{n}-p{p}" for m, n, _, p in MARKER_PAYLOADS])
def test_unsafe_pickle_is_never_executed(module, name, arg, protocol, base_pt, zckpt, tmp_path):
    data, _ = calling_pickle(module, name, arg, protocol)
    # Python's own unpickler runs it: the payload is live.
    py_dir = tmp_path / "python"
    py_dir.mkdir()
    (py_dir / "data.pkl").write_bytes(data)
    subprocess.run([sys.executable, "-c", "import pickle; pickle.loads(open('data.pkl', 'rb').read())"],
                   cwd=py_dir, check=True, capture_output=True)
    assert (py_dir / MARKER).exists(), "the payload did not run under Python's pickle"
    # zckpt refuses it, and runs nothing, wherever it runs.
    z_dir = tmp_path / "zckpt"
    (z_dir / "out").mkdir(parents=True)
    forged_pt(base_pt, z_dir / "evil.pt", data_pkl=data)
    run = zckpt("convert", "--quiet", "evil.pt", "-o", "out/evil.zckpt", cwd=z_dir)
    assert run.rc == 1, run.text
    assert sorted(os.listdir(z_dir)) == ["evil.pt", "out"]  # no marker
    assert_nothing_written(z_dir / "out")


# ---- malformed sources ------------------------------------------------------------------------


def test_forged_tensor_control(base_pt, zckpt, tmp_path):
    """Control for the forged cases below: honest numbers convert and come back as the tensor."""
    src = forged_pt(base_pt, tmp_path / "ok.pt", {"w": FakeTensor(FakeStorage("0", 16), 0, (4, 4), (4, 1))})
    zckpt.ok("convert", "--quiet", src, "-o", tmp_path / "ok.zckpt")
    zckpt.ok("export", tmp_path / "ok.zckpt", "-o", tmp_path / "back.pt")
    assert_deep_equal(torch.load(tmp_path / "back.pt"), {"w": STORAGE.reshape(4, 4)})


def _forged(**tensors):
    return lambda base, path: forged_pt(base, path, tensors)


def _bytes(data):
    return lambda base, path: path.write_bytes(data)


def _cut(n):
    def make(base, path):
        data = base.read_bytes()
        path.write_bytes(data[: n if n >= 0 else len(data) + n])
    return make


def _zip(**kw):
    return lambda base, path: rewrite_zip(base, path, **kw)


def _pkl(data):
    return lambda base, path: forged_pt(base, path, data_pkl=data)


# case: (how to make it from the base archive, what the message must say)
MALFORMED = {
    "random_bytes": (_bytes(random.Random(0).randbytes(1 << 16)), "not a torch.save file"),
    "empty_file": (_bytes(b""), "not a torch.save file"),
    "zip_magic_only": (_bytes(b"PK\x03\x04" + bytes(60)), "end of central directory"),
    **{f"truncated_zip_{n}": (_cut(n), "") for n in (30, 700, -200, -22, -1)},
    "zip_without_data_pkl": (_zip(drop={"data.pkl"}), "data.pkl"),
    "storage_record_short": (_zip(replace={"data/0": STORAGE.numpy().tobytes()[:60]}),
                             "record data/0 holds 60 bytes but the pickle claims 64"),
    "storage_record_missing": (_zip(drop={"data/0"}), "data/0"),
    "view_past_storage_offset": (_forged(w=FakeTensor(FakeStorage("0", 16), 10, (10,), (1,))), "tensor 'w'"),
    "view_past_storage_size": (_forged(w=FakeTensor(FakeStorage("0", 16), 1, (4, 4), (4, 1))), "tensor 'w'"),
    "view_past_storage_stride": (_forged(w=FakeTensor(FakeStorage("0", 16), 0, (2, 2), (15, 1))), "tensor 'w'"),
    "negative_offset": (_forged(w=FakeTensor(FakeStorage("0", 16), -1, (2,), (1,))), "tensor 'w'"),
    "negative_size": (_forged(w=FakeTensor(FakeStorage("0", 16), 0, (-2,), (1,))), "tensor 'w'"),
    "extent_overflows": (_forged(w=FakeTensor(FakeStorage("0", 16), 0, (2**40, 2**40), (2**40, 1))), "tensor 'w'"),
    "storage_claims_4GiB": (_forged(w=FakeTensor(FakeStorage("0", 2**30), 0, (16,), (1,))),
                            "the pickle claims 4294967296"),
    "storage_claims_4GiB_bytes": (_forged(w=FakeTensor(FakeStorage("0", 2**32, "ByteStorage"), 0, (16,), (1,))),
                                  "the pickle claims 4294967296"),
    "storage_key_not_in_archive": (_forged(w=FakeTensor(FakeStorage("7", 16), 0, (16,), (1,))), "data/7"),
    "one_key_two_sizes": (_forged(a=FakeTensor(FakeStorage("0", 16), 0, (16,), (1,)),
                                  b=FakeTensor(FakeStorage("0", 8), 0, (8,), (1,))), "storage key '0'"),
    "unknown_storage_class": (_pkl(forged_pickle({"w": FakeTensor(FakeStorage("0", 16), 0, (16,), (1,))}).replace(
        b"torch\nFloatStorage\n", b"torch\nNoSuchStorage\n")), "torch.NoSuchStorage"),
    "memo_never_stored": (_pkl(b"\x80\x02h\x05."), "memo key 5 was never stored"),
    "long_memo_never_stored": (_pkl(b"\x80\x02}j\xff\xff\xff\x7fs."), "memo key 2147483647 was never stored"),
    "unknown_opcode": (_pkl(b"\x80\x02}\xff."), "pickle byte offset 3: unknown opcode 0xff"),
    "no_stop": (_pkl(b"\x80\x02}"), "STOP"),
    "empty_pickle": (_pkl(b""), "STOP"),
    "stack_underflow": (_pkl(b"\x80\x02s."), "pickle byte offset 2"),
    "binunicode_length_past_end": (_pkl(b"\x80\x02X\xff\xff\xff\x7fabc."), "pickle byte offset 2"),
    "protocol_6": (_pkl(b"\x80\x06}."), "protocol 6"),
    "deep_nesting_100k_lists": (_pkl(b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."), "deeper than"),
    "deep_nesting_100k_marks": (_pkl(b"\x80\x02" + b"(" * 100_000 + b"."), "MARK"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_source_is_refused(case, base_pt, zckpt, tmp_path):
    make, message = MALFORMED[case]
    src = tmp_path / "bad.pt"
    make(base_pt, src)
    run = refuse(zckpt, src, tmp_path / "out")
    assert message in run.err, run.err


@pytest.mark.parametrize("cut", [15, 40, 200, -1])
def test_truncated_legacy_file_is_refused(cut, zckpt, tmp_path):
    full = tmp_path / "legacy_full.pt"
    torch.save({"w": STORAGE, "v": STORAGE[3:9]}, full, _use_new_zipfile_serialization=False)
    data = full.read_bytes()
    src = tmp_path / "legacy_cut.pt"
    src.write_bytes(data[: cut if cut > 0 else len(data) + cut])
    refuse(zckpt, src, tmp_path / "out")


def test_legacy_with_unsafe_global_is_refused(zckpt, tmp_path):
    """The legacy format's object pickle is checked like data.pkl."""
    full = tmp_path / "legacy.pt"
    torch.save({"w": STORAGE, "evil": "x" * 6}, full, _use_new_zipfile_serialization=False)
    data = full.read_bytes()
    # Replace the string 'xxxxxx' (BINUNICODE) by a call os.system('xxxxxx') of the same size+10:
    # GLOBAL 'os\nsystem\n' + BINUNICODE + TUPLE1 + REDUCE; the legacy reader sees it first.
    at = data.index(binunicode("x" * 6))
    evil = b"cos\nsystem\n" + binunicode("x" * 6) + b"\x85R"
    src = tmp_path / "legacy_evil.pt"
    src.write_bytes(data[:at] + evil + data[at + len(binunicode("x" * 6)):])
    run = refuse(zckpt, src, tmp_path / "out", codes=(1,))
    assert "refused global 'os.system'" in run.err, run.err


def _archive_under(folder):
    def make(base, dst):
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as out:
            for name, data in zip_records(base).items():
                out.writestr(f"{folder}/{name}", data)
    return make


# What export could not write back (names that unpack outside their folder, an archive torch.load
# refuses) is refused at convert, not kept and refused later.
NOT_WRITABLE_BACK = {
    "record_leaving_the_folder": (lambda base, dst: rewrite_zip(base, dst, add={"../evil": b"x"}), "'base/../evil'"),
    "record_with_a_dot_part": (lambda base, dst: rewrite_zip(base, dst, add={"./x": b"x"}), "'base/./x'"),
    "record_with_a_backslash": (lambda base, dst: rewrite_zip(base, dst, add={"a\\..\\x": b"x"}), "backslash"),
    "archive_folder_dotdot": (_archive_under(".."), "archive folder '..'"),
    "no_version_record": (lambda base, dst: rewrite_zip(base, dst, drop=("version",)), "no version record"),
}


@pytest.mark.parametrize("case", list(NOT_WRITABLE_BACK))
def test_archive_export_could_not_write_back_is_refused(case, base_pt, zckpt, tmp_path):
    make, message = NOT_WRITABLE_BACK[case]
    src = tmp_path / "odd.pt"
    make(base_pt, src)
    run = refuse(zckpt, src, tmp_path / "out", codes=(1,))
    assert message in run.err, run.err
