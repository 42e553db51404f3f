"""Hostile `.pt` files and containers (issue 11, pickle/Python/export half): no crash, no hang,
no code run, no wrong answer, on every path (convert, ls, verify, load, the C++ tree, zckpt.load,
load_into, export).

Containers a converter would never write come from `zckpt_forge` (tests/convert/forge_container.cc):
it rewrites a converted container with chosen records changed (a blob, metadata, a tensor record)
through ContainerWriter, so every checksum of the result is right and only the semantic checks
can catch it. Code execution is checked with a marker file: plain Python's pickle is shown to
create it (the payload is live), then zckpt is shown not to.
"""
import json
import os
import struct
import subprocess
import sys
import time
import zipfile

import pytest
import torch

import zckpt
from zckpt import _C
from torch_family import assert_deep_equal
from zckpt_testing import build_root, flip_byte, rewrite_pickle, run_cli, storage_of

# ---- tools -----------------------------------------------------------------------------------


def forge(src, dst, *edits):
    """zckpt_forge SRC DST EDITS...: the container at SRC rewritten with EDITS (see the tool)."""
    tool = os.path.join(build_root(), "tests", "convert", "zckpt_forge")
    if not os.path.exists(tool):
        pytest.skip(f"no {tool} in this build")
    r = subprocess.run([tool, str(src), str(dst), *map(str, edits)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(dst)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def u32(n):
    return struct.pack("<I", n)


def binunicode(s):
    b = s.encode()
    return b"X" + u32(len(b)) + b


def pt_with_pickle(tmp_path, data, name="crafted.pt"):
    """A torch-written archive {'w': 16 f32 (storage '0')} whose data.pkl is replaced by `data`."""
    base = tmp_path / ("base-" + name)
    torch.save({"w": torch.arange(16.0)}, base)
    out = tmp_path / name
    rewrite_pickle(base, out, lambda _: data)
    os.remove(base)
    return str(out)


def calling_pickle(module, name, *args):
    """Protocol 2: {'w': 'ok', 'evil': module.name(*args)} with str args; (bytes, GLOBAL's offset)."""
    head = b"\x80\x02}" + binunicode("w") + binunicode("ok") + b"s" + binunicode("evil")
    call = b"c" + f"{module}\n{name}\n".encode() + b"(" + b"".join(binunicode(a) for a in args) + b"tRs."
    return head + call, len(head)


def python_runs(data, marker):
    """Plain pickle.loads of `data` in a child Python; True when `marker` appeared."""
    scratch = os.path.dirname(marker)
    path = write(os.path.join(scratch, "payload.pkl"), data)
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads(open({path!r}, 'rb').read())"],
                   cwd=scratch, capture_output=True, timeout=120)
    os.remove(path)
    for _ in range(50):  # a shell it started may still be finishing
        if os.path.exists(marker):
            break
        time.sleep(0.1)
    ran = os.path.exists(marker)
    if ran:
        os.remove(marker)
    return ran


def in_child(code, timeout=300):
    """Runs `code` (with zckpt imported) in a child Python, so that a crash is a return code and
    not the end of the test run. Returns (returncode, stdout)."""
    r = subprocess.run([sys.executable, "-c", "import zckpt, torch\nfrom zckpt import _C\n" + code],
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def raises_in_child(call, timeout=300):
    """The exception class `call` (an expression) raises in a child Python, or 'returned'."""
    rc, out = in_child(f"try:\n    {call}\n    print('RESULT returned')\n"
                       f"except Exception as e:\n    print('RESULT', type(e).__name__, str(e)[:2000])\n", timeout)
    assert rc == 0, f"the child died (rc {rc}) running {call}:\n{out[-3000:]}"
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return line[len("RESULT "):]


@pytest.fixture
def shared(tmp_path):
    """{'a': t[:4], 'b': t[4:] (one storage), 'c': u (another)}: (obj, .pt, converted .zckpt)."""
    t, u = torch.arange(8.0), torch.arange(8.0) + 100
    obj = {"a": t[:4], "b": t[4:], "c": u}
    pt = tmp_path / "shared.pt"
    torch.save(obj, pt)
    path = tmp_path / "shared.zckpt"
    zckpt.convert(pt, path)
    return obj, str(pt), str(path)


# ---- 3. deep nesting through the memo ----------------------------------------------------------

DEEP = 100_000


def memo_chain(levels, how):
    """L0 = []; per level Li = [] (memoized), then L(i-1).append(X) while Li is still empty, X being
    Li itself ('list'), {Li: None} ('key'), or collections.OrderedDict(Li) ('args'). Only the
    finished tree is `levels` deep."""
    out = bytearray(b"\x80\x02ccollections\nOrderedDict\nr" + u32(0) + b"0]r" + u32(1))
    for i in range(1, levels + 1):
        out += b"]r" + u32(i + 1) + b"0j" + u32(i)
        if how == "list":
            out += b"j" + u32(i + 1)
        elif how == "key":
            out += b"}j" + u32(i + 1) + b"Ns"
        else:
            out += b"j" + u32(0) + b"j" + u32(i + 1) + b"\x85R"
        out += b"a0"
    out += b"0j" + u32(1) + b"."
    return bytes(out)


@pytest.mark.parametrize("how", ["list", "key", "args"])
def test_deep_nesting_through_the_memo_is_refused_by_convert(tmp_path, how):
    src = pt_with_pickle(tmp_path, memo_chain(DEEP, how))
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", src, "-o", out / "deep.zckpt")
    assert r.returncode == 1, r.stderr
    assert src in r.stderr and "nesting deeper than 1000" in r.stderr, r.stderr
    assert os.listdir(out) == []
    with pytest.raises(zckpt.CorruptError, match="nesting deeper than 1000"):
        zckpt.convert(src, out / "deep.zckpt")


def test_deep_pickle_in_a_forged_container_crashes_nothing(tmp_path, shared):
    """A container never converted, whose data.pkl is 100k deep: every reader refuses it cleanly."""
    _, _, base = shared
    deep = forge(base, tmp_path / "deep.zckpt", "--blob", f"data.pkl={write(tmp_path / 'deep.pkl', memo_chain(DEEP, 'list'))}")
    r = run_cli("ls", deep)
    assert r.returncode == 0 and "nesting deeper than 1000" in r.stdout, r.stdout + r.stderr
    r = run_cli("ls", "--json", deep)
    assert r.returncode == 0 and "nesting deeper than 1000" in json.loads(r.stdout)["pickle"]["error"]
    r = run_cli("verify", deep)
    assert r.returncode == 1 and "nesting deeper than 1000" in r.stderr, r.stdout + r.stderr
    r = run_cli("load", deep)
    assert r.returncode == 1 and "nesting deeper than 1000" in r.stderr, r.stdout + r.stderr
    r = run_cli("export", deep, "-o", tmp_path / "back.pt")
    assert r.returncode == 1 and not (tmp_path / "back.pt").exists(), r.stderr
    for call in (f"zckpt.load({deep!r})", f"zckpt.load({deep!r}, weights_only=False)",
                 f"zckpt.load({deep!r}, mmap=True)", f"_C.load_tree({deep!r})", f"_C.load_tree({deep!r}, map=True)",
                 f"zckpt.load_into({deep!r}, {{'a': torch.zeros(4)}}, strict=False)"):
        got = raises_in_child(call)
        assert got.startswith("CorruptError") and "nesting deeper than 1000" in got and deep in got, (call, got)


# ---- 5. input-size-dependent steps stay cheap ---------------------------------------------------


def timed_cli(*args, timeout=120):
    t0 = time.monotonic()
    r = subprocess.run([os.environ.get("ZCKPT_BIN") or os.path.join(build_root(), "tools", "zckpt"), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def test_a_million_digit_int_literal_is_refused_in_seconds(tmp_path, shared):
    # {'w': <1,000,000-digit INT>}: converting it digit by digit took minutes (quadratic).
    data = b"\x80\x02}" + binunicode("w") + b"I" + b"7" * 1_000_000 + b"\ns."
    src = pt_with_pickle(tmp_path, data)
    r, secs = timed_cli("convert", src, "-o", tmp_path / "int.zckpt")
    assert r.returncode == 1 and "more than 4300 digits" in r.stderr, r.stderr
    assert secs < 30, f"convert took {secs:.1f} s"
    _, _, base = shared
    forged = forge(base, tmp_path / "int-forged.zckpt", "--blob", f"data.pkl={write(tmp_path / 'int.pkl', data)}")
    for args in (("ls", forged), ("verify", forged), ("load", forged)):
        r, secs = timed_cli(*args)
        assert secs < 30 and "more than 4300 digits" in r.stdout + r.stderr, (args, secs, r.stdout, r.stderr)
    t0 = time.monotonic()
    with pytest.raises(zckpt.CorruptError, match="more than 4300 digits"):
        zckpt.load(forged)
    assert time.monotonic() - t0 < 30


def equal_keys_pickle(n):
    """{'w': t, 'w': t, ...}: one tensor over the base archive's storage '0' under n equal keys."""
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\n((" + binunicode("storage") + b"ctorch\nFloatStorage\n" +
              binunicode("0") + binunicode("cpu") + b"K\x10tQK\x00K\x10\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRq\x01")
    return b"\x80\x02}(" + binunicode("w") + tensor + (binunicode("w") + b"h\x01") * (n - 1) + b"u."


def test_one_tensor_under_100k_equal_keys_converts_and_loads_in_seconds(tmp_path):
    # Every repeat is a tensor record named w~N; looking for N from 1 each time was quadratic.
    n = 100_000
    src = pt_with_pickle(tmp_path, equal_keys_pickle(n))
    dst = tmp_path / "keys.zckpt"
    r, secs = timed_cli("convert", src, "-o", dst, timeout=300)
    assert r.returncode == 0, r.stderr
    assert secs < 60, f"convert took {secs:.1f} s"
    r, secs = timed_cli("ls", "--json", dst, timeout=300)
    names = [t["name"] for t in json.loads(r.stdout)["tensors"]]
    assert len(names) == n and names[:3] == ["w", "w~1", "w~2"] and names[-1] == f"w~{n - 1}"
    assert secs < 60, f"ls took {secs:.1f} s"
    t0 = time.monotonic()
    got = zckpt.load(dst)
    assert time.monotonic() - t0 < 60
    assert_deep_equal(got, torch.load(src, weights_only=True))  # {'w': arange(16)}: the last key wins


# ---- 7. nothing is handed to an unpickler before zckpt has vetted it ---------------------------

# Globals an older deny list let through (stdlib process spawners, torch's benchmark Timer,
# numpy's text writer), and some it always had: refused everywhere, whatever the caller allows.
CODE_RUNNING = [
    ("os", "popen"), ("subprocess", "check_output"), ("pty", "spawn"), ("platform", "popen"),
    ("imaplib", "IMAP4_stream"), ("uuid", "_get_command_stdout"), ("_osx_support", "_read_output"),
    ("torch.utils.benchmark", "Timer"), ("torch.utils.benchmark.utils.timer", "Timer"), ("numpy", "savetxt"),
    ("os", "system"), ("builtins", "exec"),
]


@pytest.mark.parametrize("module,name", CODE_RUNNING, ids=[f"{m}.{n}" for m, n in CODE_RUNNING])
def test_code_running_globals_are_refused_everywhere(tmp_path, shared, module, name):
    marker = str(tmp_path / "marker")
    data, offset = calling_pickle(module, name, "touch " + marker)
    refusal = f"refused global '{module}.{name}' at pickle byte offset {offset}"
    src = pt_with_pickle(tmp_path, data)
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", src, "-o", out / "x.zckpt", "--allow-global", f"{module}.{name}")
    assert r.returncode == 1 and refusal in r.stderr, r.stderr
    assert os.listdir(out) == []
    # A container holding it that no converter vetted: load and export vet it themselves.
    _, _, base = shared
    forged = forge(base, tmp_path / "evil.zckpt", "--blob", f"data.pkl={write(tmp_path / 'evil.pkl', data)}")
    for weights_only in (True, False):
        with pytest.raises(zckpt.UnsafeError, match=refusal.replace(".", r"\.")) as e:
            zckpt.load(forged, weights_only=weights_only, allow_globals=[f"{module}.{name}"])
        assert forged in str(e.value)
    r = run_cli("export", forged, "-o", out / "back.pt", "--allow-global", f"{module}.{name}")
    assert r.returncode == 1 and refusal in r.stderr, r.stderr
    assert os.listdir(out) == []
    assert not os.path.exists(marker)


LIVE = [("os", "popen", lambda m: ["touch " + m]), ("os", "system", lambda m: ["touch " + m]),
        ("uuid", "_get_command_stdout", lambda m: ["touch", m]), ("imaplib", "IMAP4_stream", lambda m: ["touch " + m]),
        ("numpy", "savetxt", lambda m: [m, "1"])]


@pytest.mark.parametrize("module,name,args", LIVE, ids=[f"{m}.{n}" for m, n, _ in LIVE])
def test_a_forged_container_runs_no_code_where_python_would(tmp_path, shared, module, name, args):
    """zckpt.load(weights_only=False) used to replay the kept pickle through torch's unpickler
    unvetted: a container no converter saw ran its payload."""
    marker = str(tmp_path / "marker")
    if module == "numpy":  # savetxt(fname, X): X must be an array-like of numbers
        data = (b"\x80\x02}" + binunicode("evil") + b"cnumpy\nsavetxt\n(" + binunicode(marker) +
                b"]G?\xf0\x00\x00\x00\x00\x00\x00atRs.")
    else:
        data, _ = calling_pickle(module, name, *args(marker))
    assert python_runs(data, marker), "plain pickle did not run the payload: the test proves nothing"
    _, _, base = shared
    forged = forge(base, tmp_path / "evil.zckpt", "--blob", f"data.pkl={write(tmp_path / 'evil.pkl', data)}")
    with pytest.raises(zckpt.UnsafeError, match=f"refused global '{module}.{name}'"):
        zckpt.load(forged, weights_only=False)
    with pytest.raises(zckpt.UnsafeError):
        zckpt.load(forged, weights_only=False, mmap=True)
    with pytest.raises(zckpt.UnsafeError):
        zckpt.export(forged, tmp_path / "back.pt")
    with pytest.raises(zckpt.UnsafeError):
        zckpt.load_into(forged, {"a": torch.zeros(4)}, strict=False, weights_only=False)
    assert not os.path.exists(marker) and not (tmp_path / "back.pt").exists()


def legacy_pt(path, payload_global):
    """A legacy-format torch.save of {'weight': ..., 'payload': <global>('touch ...')}."""
    stand_in = b"c__builtin__\nprint\n"

    class Call:
        def __reduce__(self):
            return print, ("touch " + os.path.join(os.path.dirname(path), "marker"),)

    tmp = path + ".tmp"
    torch.save({"weight": torch.arange(6.0), "payload": Call()}, tmp, _use_new_zipfile_serialization=False,
               pickle_protocol=2)
    data = open(tmp, "rb").read()
    os.remove(tmp)
    assert data.count(stand_in) == 1
    return write(path, data.replace(stand_in, payload_global))


def legacy_pickles(data):
    """(start, end) of the five pickles a legacy file starts with; the data section follows."""
    import io
    import pickletools

    f, spans = io.BytesIO(data), []
    for _ in range(5):
        start = f.tell()
        for op, _, _ in pickletools.genops(f):
            if op.name == "STOP":
                break
        spans.append((start, f.tell()))
    return spans


def test_export_vets_every_pickle_of_a_legacy_header(tmp_path):
    """export wrote the kept legacy header verbatim: five pickles torch.load unpickles in turn."""
    benign = legacy_pt(str(tmp_path / "benign.pt"), b"c__builtin__\nset\n")  # set('touch ...'): data
    hostile = legacy_pt(str(tmp_path / "hostile.pt"), b"cos\nsystem\n")
    marker = tmp_path / "marker"
    torch.load(hostile, weights_only=False)  # the payload is live under torch.load
    assert marker.exists()
    marker.unlink()
    base = str(tmp_path / "benign.zckpt")
    zckpt.convert(benign, base)
    zckpt.export(base, tmp_path / "benign-back.pt")
    assert open(tmp_path / "benign-back.pt", "rb").read() == open(benign, "rb").read()
    data = open(hostile, "rb").read()
    spans = legacy_pickles(data)
    header = write(tmp_path / "header.bin", data[:spans[4][1]])
    objects = write(tmp_path / "objects.pkl", data[spans[3][0]:spans[3][1]])
    # The hostile header next to the benign data.pkl, and next to its own object pickle.
    f1 = forge(base, tmp_path / "f1.zckpt", "--blob", f"legacy.header={header}")
    f2 = forge(f1, tmp_path / "f2.zckpt", "--blob", f"data.pkl={objects}")
    for forged in (f1, f2):
        r = run_cli("export", forged, "-o", tmp_path / "back.pt")
        assert r.returncode == 1 and "refused global 'os.system'" in r.stderr and forged in r.stderr, r.stderr
        assert not (tmp_path / "back.pt").exists()
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["container", "dcp-folder"])
def test_verify_and_the_cli_agree_on_an_unsafe_pickle(tmp_path, shared, shape):
    """A refused global is a finding (error.h's IsFinding): `zckpt verify` exits 1 and zckpt.verify
    returns it in its list, or raises CorruptError listing it, as for a damaged file. A DCP
    folder's refused `.metadata` used to raise UnsafeError from zckpt.verify, as a file that could
    not be checked (exit 2) would."""
    marker = str(tmp_path / "marker")
    data, _ = calling_pickle("os", "system", "touch " + marker)
    if shape == "container":
        _, _, base = shared
        path = forge(base, tmp_path / "evil.zckpt", "--blob", f"data.pkl={write(tmp_path / 'evil.pkl', data)}")
    else:
        import torch.distributed.checkpoint as dcp
        from zckpt.dcp import ZckptStorageWriter

        path = str(tmp_path / "evil")
        dcp.save({"x": torch.ones(2)}, storage_writer=ZckptStorageWriter(path), no_dist=True)
        write(os.path.join(path, ".metadata"), data)
    r = run_cli("verify", path)
    assert r.returncode == 1 and "refused global 'os.system'" in r.stderr, r.stdout + r.stderr
    problems = zckpt.verify(path, raise_on_error=False)
    assert any("refused global 'os.system'" in p for p in problems), problems
    with pytest.raises(zckpt.CorruptError, match="refused global 'os.system'") as e:
        zckpt.verify(path)
    assert [p["kind"] for p in e.value.problems] == ["unsafe"] and e.value.file == path
    assert not os.path.exists(marker)


def test_a_dcp_folder_whose_container_is_not_one_could_not_be_checked(tmp_path):
    """Within a DCP folder too only a finding is exit 1 and a listed problem: a container the
    folder names that is no container at all could not be checked (exit 2, as for a container
    given alone), and zckpt.verify raises its error, placed at the item that named it."""
    import torch.distributed.checkpoint as dcp
    from zckpt.dcp import ZckptStorageWriter

    path = str(tmp_path / "folder")
    dcp.save({"x": torch.ones(2)}, storage_writer=ZckptStorageWriter(path), no_dist=True)
    assert run_cli("verify", path).returncode == 0
    (container,) = [n for n in os.listdir(path) if n.endswith(".zckpt")]
    write(os.path.join(path, container), b"not a container, " * 16)
    r = run_cli("verify", path)
    assert r.returncode == 2 and f"{path}: ERROR" in r.stdout and container in r.stderr, r.stdout + r.stderr
    with pytest.raises(zckpt.ZckptError, match=container) as e:
        zckpt.verify(path)
    assert not isinstance(e.value, zckpt.CorruptError)
    assert e.value.file == path and e.value.tensors == ["x"]


# ---- 8. the pickle and the index must agree ----------------------------------------------------

DISAGREEMENTS = [
    ("offset", ["--tensor", "b:offset=0"], "tensor 'b': storage offset 4 in the pickle, 0 in the index"),
    ("shape", ["--tensor", "b:shape=2,2", "--tensor", "b:stride=2,1"], "tensor 'b': shape [4] in the pickle, [2, 2] in the index"),
    ("stride", ["--tensor", "b:stride=0"], "tensor 'b': stride [1] in the pickle, [0] in the index"),
    ("dtype", ["--tensor", "b:dtype=int32"], "tensor 'b': dtype float32 in the pickle, int32 in the index"),
    ("storage", ["--tensor", "b:storage=1"], "tensor 'b': storage '0' in the pickle, '1' in the index"),
    ("flags", ["--tensor", "b:flags=1"], "tensor 'b': flags 0 in the pickle, 1 in the index"),
    ("name", ["--tensor", "b:name=z"], "tensor 'b': described by the pickle, absent from the index"),
]


@pytest.mark.parametrize("what,edits,message", DISAGREEMENTS, ids=[d[0] for d in DISAGREEMENTS])
def test_an_index_that_disagrees_with_the_pickle_is_refused_by_every_reader(tmp_path, shared, what, edits, message):
    obj, pt, base = shared
    forged = forge(base, tmp_path / "forged.zckpt", *edits)
    r = run_cli("verify", forged)
    assert r.returncode == 1 and message in r.stderr and forged in r.stderr, r.stdout + r.stderr
    assert any(message in p for p in zckpt.verify(forged, raise_on_error=False))
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.verify(forged)
    found = [p for p in e.value.problems if message in p["message"]]
    assert found and all(p["kind"] == "corrupt" and p["file"] == forged and p["tensors"] == ["b"] and
                         p["storage"] is None and p["chunk"] is None for p in found), e.value.problems
    for call in (lambda: zckpt.load(forged), lambda: zckpt.load(forged, mmap=True, verify=False),
                 lambda: zckpt.load_into(forged, {k: torch.zeros_like(v) for k, v in obj.items()}, strict=False),
                 lambda: _C.load_tree(forged), lambda: _C.load_tree(forged, map=True),
                 lambda: zckpt.export(forged, tmp_path / "back.pt"),
                 lambda: zckpt.export(forged, tmp_path / "back.safetensors")):
        with pytest.raises(zckpt.CorruptError) as e:
            call()
        assert forged in str(e.value) and message in str(e.value)
    r = run_cli("load", forged)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "back.pt").exists() and not (tmp_path / "back.safetensors").exists()


def test_a_pickle_that_disagrees_with_the_index_is_refused(tmp_path, shared):
    """The other side: the index as convert wrote it, the pickle of another save (b viewing the
    first half of the storage). zckpt.load would give b = [0..3], Load [4..7]."""
    obj, _, base = shared
    other = tmp_path / "other.pt"
    torch.save({"a": obj["a"], "b": obj["a"].view(4), "c": obj["c"]}, other)
    pkl = [n for n in zipfile.ZipFile(other).namelist() if n.endswith("/data.pkl")][0]
    forged = forge(base, tmp_path / "forged.zckpt",
                   "--blob", f"data.pkl={write(tmp_path / 'other.pkl', zipfile.ZipFile(other).read(pkl))}")
    with pytest.raises(zckpt.CorruptError, match="tensor 'b': storage offset 0 in the pickle, 4 in the index"):
        zckpt.load(forged)
    assert run_cli("verify", forged).returncode == 1


def test_the_forge_itself_changes_nothing_it_is_not_asked_to(tmp_path, shared):
    """Control for the tests above: an unedited rewrite verifies and loads as the original."""
    obj, pt, base = shared
    same = forge(base, tmp_path / "same.zckpt")
    assert run_cli("verify", same).returncode == 0
    assert zckpt.verify(same, raise_on_error=False) == []
    assert_deep_equal(zckpt.load(same), torch.load(pt, weights_only=True))
    assert_deep_equal(_C.load_tree(same), zckpt.load(same))
    zckpt.export(same, tmp_path / "back.pt")
    assert_deep_equal(torch.load(tmp_path / "back.pt", weights_only=True), obj)


# ---- 10. mmap=True with verify=True checks before returning ------------------------------------


def test_mmap_with_verify_refuses_a_flipped_bit(tmp_path):
    state = {"w": torch.randn(64, 64), "b": torch.ones(8)}
    pt = tmp_path / "m.pt"
    torch.save(state, pt)
    path = str(tmp_path / "m.zckpt")
    zckpt.convert(pt, path)
    assert_deep_equal(zckpt.load(path, mmap=True), state)  # sound: verified and returned
    at = storage_of(path, "w")["offset"] + 100
    flip_byte(path, at)
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load(path, mmap=True)  # verify=True is the default
    assert path in str(e.value) and "tensors w" in str(e.value)
    # verify=False: the documented way to read nothing up front, and then nothing is checked.
    got = zckpt.load(path, mmap=True, verify=False)
    assert not torch.equal(got["w"], state["w"])


# ---- export: safe, complete archives -----------------------------------------------------------

UNSAFE_RECORDS = ["../evil", "/etc/evil", "data/../../evil", "a//b", "./data.pkl", "a\\..\\evil"]


@pytest.mark.parametrize("name", UNSAFE_RECORDS)
def test_export_refuses_record_names_that_leave_the_archive_folder(tmp_path, shared, name):
    _, _, base = shared
    records = open_records(base) + [name]
    forged = forge(base, tmp_path / "f.zckpt", "--blob", f"{name}=" + write(tmp_path / "x", b"x"),
                   "--metadata-file", "zckpt.source.records=" + write(tmp_path / "records", b"\0".join(
                       r.encode() for r in records) + b"\0"))
    r = run_cli("export", forged, "-o", tmp_path / "out.pt")
    assert r.returncode == 1 and forged in r.stderr and f"'{name}'" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("prefix", ["..", ".", "/abs", "a/b", "a\\b"])
def test_export_refuses_an_archive_folder_that_is_no_plain_name(tmp_path, shared, prefix):
    _, _, base = shared
    forged = forge(base, tmp_path / "f.zckpt", "--metadata", f"zckpt.source.prefix={prefix}")
    r = run_cli("export", forged, "-o", tmp_path / "out.pt")
    assert r.returncode == 1 and "zckpt.source.prefix" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()


def open_records(path):
    return [r for r in zckpt_metadata(path)["zckpt.source.records"].split("\0") if r]


def zckpt_metadata(path):
    return _C.describe(path)["metadata"]


def test_export_refuses_a_torchscript_marker_record(tmp_path, shared):
    _, _, base = shared
    records = open_records(base) + ["constants.pkl"]
    forged = forge(base, tmp_path / "f.zckpt", "--blob", "constants.pkl=" + write(tmp_path / "c", b"\x80\x02)."),
                   "--metadata-file", "zckpt.source.records=" + write(tmp_path / "records", b"\0".join(
                       r.encode() for r in records) + b"\0"))
    r = run_cli("export", forged, "-o", tmp_path / "out.pt")
    assert r.returncode == 1 and "constants.pkl" in r.stderr and "TorchScript" in r.stderr, r.stderr


def test_export_without_the_source_record_list_writes_a_complete_archive(tmp_path, shared):
    """A container not made by convert (no zckpt.source.records): export used to write data.pkl
    and the storages only, which torch.load rejects (no `version`)."""
    obj, _, base = shared
    bare = forge(base, tmp_path / "bare.zckpt", "--drop-metadata", "zckpt.source.records",
                 "--drop-metadata", "zckpt.source.prefix")
    for blob in ("byteorder", "version", ".format_version", ".storage_alignment", ".data/serialization_id"):
        bare = forge(bare, tmp_path / f"bare-{len(blob)}.zckpt", "--drop-blob", blob)
    zckpt.export(bare, tmp_path / "back.pt")
    assert_deep_equal(torch.load(tmp_path / "back.pt", weights_only=True), obj)
    names = [n.split("/", 1)[1] for n in zipfile.ZipFile(tmp_path / "back.pt").namelist()]
    assert names[0] == "data.pkl" and "version" in names and "byteorder" in names


def test_export_refuses_a_record_list_without_version(tmp_path, shared):
    _, _, base = shared
    records = [r for r in open_records(base) if r != "version"]
    forged = forge(base, tmp_path / "f.zckpt", "--metadata-file", "zckpt.source.records=" + write(
        tmp_path / "records", b"\0".join(r.encode() for r in records) + b"\0"))
    r = run_cli("export", forged, "-o", tmp_path / "out.pt")
    assert r.returncode == 1 and "'version'" in r.stderr, r.stderr


# ---- malformed pickles reach Python as one zckpt error naming the file --------------------------

MALFORMED = [
    ("truncated", lambda good: good[: len(good) // 2]),                        # EOFError under torch
    ("bad utf-8", lambda good: b"\x80\x02X\x02\x00\x00\x00\xff\xfe."),          # UnicodeDecodeError
    ("pid not a tuple", lambda good: b"\x80\x02X\x07\x00\x00\x00storageQ."),   # AssertionError
    ("unknown opcode", lambda good: b"\x80\x02\xff."),
]


def test_a_pickle_torch_cannot_rebuild_raises_a_zckpt_error_naming_the_file(tmp_path):
    """Read by zckpt's interpreter (an object it never builds), refused by torch's unpickler
    (TypeError): a CorruptError naming the file either way, not torch's bare TypeError."""
    pt = tmp_path / "size.pt"
    torch.save({"x": torch.Size([1])}, pt)
    base = str(tmp_path / "size.zckpt")
    zckpt.convert(pt, base)
    data = b"\x80\x02}" + binunicode("x") + b"ctorch\nSize\n(" + binunicode("a") + b"tRs."
    forged = forge(base, tmp_path / "bad.zckpt", "--blob", f"data.pkl={write(tmp_path / 'bad.pkl', data)}")
    for weights_only in (True, False):
        with pytest.raises(zckpt.CorruptError, match="TypeError") as e:
            zckpt.load(forged, weights_only=weights_only)
        assert forged in str(e.value)


@pytest.mark.parametrize("what,make", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_pickles_raise_one_zckpt_error_naming_the_file(tmp_path, shared, what, make):
    _, pt, base = shared
    good = zipfile.ZipFile(pt).read([n for n in zipfile.ZipFile(pt).namelist() if n.endswith("/data.pkl")][0])
    forged = forge(base, tmp_path / "bad.zckpt", "--blob", f"data.pkl={write(tmp_path / 'bad.pkl', make(good))}")
    for weights_only in (True, False):
        with pytest.raises(zckpt.ZckptError) as e:
            zckpt.load(forged, weights_only=weights_only)
        assert isinstance(e.value, zckpt.CorruptError) and forged in str(e.value), repr(e.value)


def test_ls_names_the_globals_load_and_export_will_need_allowed(tmp_path):
    from zckpt_testing import Config

    pt = tmp_path / "cfg.pt"
    torch.save({"cfg": Config("x", 1), "w": torch.ones(2)}, pt)
    path = str(tmp_path / "cfg.zckpt")
    zckpt.convert(pt, path, allow_globals=[Config])
    r = run_cli("ls", path)
    assert r.returncode == 0 and "GLOBALS OFF THE ALLOWLIST" in r.stdout and "zckpt_testing.Config" in r.stdout
    assert json.loads(run_cli("ls", "--json", path).stdout)["pickle"]["off_allowlist"] == ["zckpt_testing.Config"]
    r = run_cli("export", path, "-o", tmp_path / "back.pt")
    assert r.returncode == 1 and "--allow-global zckpt_testing.Config" in r.stderr, r.stderr
    assert run_cli("export", path, "-o", tmp_path / "back.pt", "--allow-global", "zckpt_testing.Config").returncode == 0
    r = run_cli("load", path)
    assert r.returncode == 1 and "zckpt_testing.Config" in r.stderr, r.stderr
    assert run_cli("load", path, "--allow-global", "zckpt_testing.Config").returncode == 0
