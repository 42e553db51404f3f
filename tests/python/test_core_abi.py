"""The C interface of libzckpt_core.so (include/zckpt/zckpt.h) held to its contract from Python, as
zckpt/_core.py uses it: every function of the header is exported and declared with argtypes,
the status numbers and names are the pinned ones, and a call the core cannot take (unknown,
malformed, a handle of another kind, released twice, used after close) raises
InvalidArgumentError instead of crashing. tests/capi/zckpt_c_test.c checks the same as a C program."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest
import torch

import zckpt
from zckpt import _core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "include", "zckpt", "zckpt.h")


def header_text():
    with open(HEADER) as f:
        return f.read()


def header_functions():
    return set(re.findall(r"^[\w\s\*]*?\b(zckpt_\w+)\(", header_text(), re.M))


def test_every_function_of_the_header_is_declared_with_its_types():
    declared = set(_core._SIGNATURES)
    assert header_functions() == declared
    for name in declared:
        fn = getattr(_core._LIB, name)
        assert fn.argtypes is not None, name


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm to list the library's symbols")
def test_the_library_exports_the_header_and_nothing_else():
    out = subprocess.run(["nm", "-D", "--defined-only", _core._LIB._name], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] in (["T"], ["W"])}
    assert exported == header_functions()


def test_status_numbers_and_names_are_pinned():
    enum = dict((name, int(n)) for name, n in re.findall(r"^\s*(ZCKPT_\w+) = (\d+)", header_text(), re.M))
    assert enum == {"ZCKPT_OK": 0, "ZCKPT_ERROR_IO": 1, "ZCKPT_ERROR_NOT_A_CONTAINER": 2, "ZCKPT_ERROR_CORRUPT": 3,
                    "ZCKPT_ERROR_UNSUPPORTED": 4, "ZCKPT_ERROR_UNSAFE": 5, "ZCKPT_ERROR_INVALID_ARGUMENT": 6,
                    "ZCKPT_ERROR_CANCELLED": 7, "ZCKPT_ERROR_OUT_OF_MEMORY": 8, "ZCKPT_ERROR_HOST_MEMORY": 9,
                    "ZCKPT_ERROR_INTERNAL": 10}
    names = [_core._LIB.zckpt_status_name(i).decode() for i in range(12)]
    assert names == ["ok", "io", "not-a-container", "corrupt", "unsupported", "unsafe", "invalid-argument",
                     "cancelled", "out-of-memory", "memory", "internal", "unknown"]
    # Each error kind's name is the one its Python class answers to.
    for i in range(1, 9):
        assert _core.for_kind(names[i], "m", {}).kind == names[i]
    assert _core._LIB.zckpt_abi_version() == _core.ABI_VERSION
    assert f"#define ZCKPT_ABI_VERSION {_core.ABI_VERSION}u" in header_text()


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "m.zckpt")
    zckpt.save({"w": torch.arange(40_000, dtype=torch.float32), "b": torch.ones(3)}, path)
    return path


def test_an_unknown_call_and_a_malformed_request_are_refused():
    with pytest.raises(zckpt.InvalidArgumentError, match="no call 'no_such_call'"):
        _core._call("no_such_call")
    with pytest.raises(zckpt.InvalidArgumentError, match="malformed request"):
        _core._call("describe")  # neither path nor checkpoint
    result = _core._LIB.zckpt_call(b"{not json", 9)
    try:
        n = ctypes.c_size_t()
        text = ctypes.string_at(_core._LIB.zckpt_result_json(result, ctypes.byref(n)), n.value).decode()
    finally:
        _core._LIB.zckpt_result_free(result)
    assert '"kind":"invalid-argument"' in text and "malformed request" in text


def test_a_handle_of_another_kind_a_double_release_and_a_call_after_close(saved):
    ckpt = _core.open(saved)
    buf = _core.HostBuffer(16)
    wrong = _core._CheckpointHandle(buf._owner.handle.id)
    with pytest.raises(zckpt.InvalidArgumentError, match=r"is not an open checkpoint \(another kind\)"):
        _core._typed(_core._LIB.zckpt_close, wrong)
    handle = ckpt._held.handle
    _core._typed(_core._LIB.zckpt_close, handle)
    with pytest.raises(zckpt.InvalidArgumentError, match=r"is not an open checkpoint \(released"):
        _core._typed(_core._LIB.zckpt_close, handle)
    with pytest.raises(zckpt.InvalidArgumentError, match="is not an open checkpoint"):
        ckpt.load_ranges([(0, 0, 16, buf.address, -1)], {})
    with pytest.raises(zckpt.InvalidArgumentError, match="is not an open checkpoint"):
        ckpt.describe()
    assert bytes(buf) is not None  # the buffer is untouched by its checkpoint's close


def test_ten_thousand_ranges_go_in_as_one_array_and_land_in_place(saved):
    ckpt = _core.open(saved)
    buf = _core.HostBuffer(160_000)
    # 10,000 ranges of 16 bytes, each to the place of the next in reverse: every one must land.
    ranges = [(0, i * 16, (i + 1) * 16, buf.address + (9_999 - i) * 16, -1) for i in range(10_000)]
    stats = ckpt.load_ranges(ranges, {}, verify=True, threads=1)
    got = torch.frombuffer(buf, dtype=torch.float32).view(10_000, 4).flip(0).reshape(-1)
    assert torch.equal(got, torch.arange(40_000, dtype=torch.float32))
    assert stats["raw_bytes"] == 160_000 and stats["verified"] is True and stats["threads"] == 1


def test_a_writer_refuses_bytes_that_are_not_its_shape_and_leaves_nothing(tmp_path):
    path = str(tmp_path / "never.zckpt")
    w = _core.ContainerWriter(path)
    data = b"\0" * 12
    with pytest.raises(zckpt.InvalidArgumentError, match="12 bytes for 4 elements of float32"):
        w.add_tensor("0", "t", "float32", [4], ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, 12)
    del w
    assert not os.path.exists(path)
