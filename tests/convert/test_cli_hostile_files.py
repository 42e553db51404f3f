"""The command line on hostile paths and names (issue 11): FIFOs and other non-regular files never
block or get replaced, names from a file never forge a line of `ls` or break its JSON, and a file
truncated while `zckpt verify` / `zckpt load` read it ends in exit code 2 naming it, never in a
signal."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time

import pytest
import torch

# The names of one container: each must stay one row of `ls` and round-trip through its JSON.
HOSTILE_NAMES = [
    "a\nfake.weight float32 [4] 16",   # a newline forging a row
    "\x1b[2J\x1b[31mred",              # terminal escapes: clear the screen, red
    "\u202eevil",                      # a right-to-left override
    "tab\there\rcr\x7fdel\x9bcsi",     # tab, carriage return, DEL, a C1 CSI
    "back\\slash",
    "bad\udcff\udc80",                 # pickled with surrogatepass: bytes that are not UTF-8
    "ok",
]


def _pickled_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")  # what torch.save's pickle writes for a str


@pytest.fixture(scope="module")
def hostile_names(zckpt, tmp_path_factory):
    d = tmp_path_factory.mktemp("names")
    pt = d / "names.pt"
    torch.save({n: torch.full((4,), float(i)) for i, n in enumerate(HOSTILE_NAMES)}, pt)
    dst = d / "names.zckpt"
    zckpt.ok("convert", "--quiet", pt, "-o", dst)
    return dst


@pytest.fixture(scope="module")
def small(zckpt, tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    pt = d / "small.pt"
    torch.save({"w": torch.arange(24.0).reshape(4, 6)}, pt)
    dst = d / "small.zckpt"
    zckpt.ok("convert", "--quiet", pt, "-o", dst)
    return pt, dst


# --- item 11: names cannot forge rows or break JSON ---

def test_ls_text_shows_each_name_on_its_own_row_escaped(zckpt, hostile_names):
    p = subprocess.run([zckpt.path, "ls", str(hostile_names)], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert b"\x1b" not in out and b"\r" not in out and b"\x7f" not in out
    assert "\u202e".encode() not in out and "\u009b".encode() not in out
    text = out.decode("utf-8")  # whatever the names, the output is UTF-8 text
    rows = text.split("\n\n")[1].splitlines()  # the TENSOR table: a header, then one row a tensor
    assert rows[0].startswith("TENSOR")
    assert len(rows) == 1 + len(HOSTILE_NAMES), rows
    assert rows[1].startswith("a\\nfake.weight float32 [4] 16 ")
    assert rows[2].startswith("\\x1b[2J\\x1b[31mred ")
    assert rows[3].startswith("\\u202eevil ")
    assert rows[4].startswith("tab\\there\\rcr\\x7fdel\\u009bcsi ")
    assert rows[5].startswith("back\\\\slash ")
    assert rows[6].startswith("bad\\xed\\xb3\\xbf\\xed\\xb2\\x80 ")


def test_ls_json_is_valid_and_gives_the_bytes_back(zckpt, hostile_names):
    p = subprocess.run([zckpt.path, "ls", "--json", str(hostile_names)], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p.stdout.decode("utf-8")  # valid UTF-8: no raw name bytes
    listing = json.loads(p.stdout)
    got = [t["name"].encode("utf-8", "surrogateescape") for t in listing["tensors"]]
    assert sorted(got) == sorted(_pickled_bytes(n) for n in HOSTILE_NAMES)


def test_verify_prints_hostile_names_escaped(zckpt, hostile_names, tmp_path):
    """A problem message quotes names from the file: one line each, no escape sequence."""
    data = bytearray(hostile_names.read_bytes())
    listing = zckpt.ls(hostile_names)
    for s in listing["storages"]:
        data[s["offset"]] ^= 0x01  # every storage's first byte: every tensor is named in a problem
    bad = tmp_path / "bad.zckpt"
    bad.write_bytes(bytes(data))
    p = subprocess.run([zckpt.path, "verify", str(bad)], capture_output=True, timeout=60)
    assert p.returncode == 1
    assert b"\x1b" not in p.stderr and "\u202e".encode() not in p.stderr
    problems = p.stderr.decode("utf-8").splitlines()
    assert len(problems) == len(listing["storages"]), problems
    assert all(line.startswith("  ") and "chunk" in line for line in problems)


# --- item 6: FIFOs and other non-regular files never block ---

@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.zckpt"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", [
    ["verify", "{f}"], ["ls", "{f}"], ["ls", "--json", "{f}"], ["export", "{f}", "-o", "{out}"],
    ["convert", "{f}", "-o", "{out}"], ["load", "{f}"], ["load", "--map", "{f}"],
])
def test_fifo_source_is_refused_without_blocking(zckpt, fifo, tmp_path, command):
    args = [a.format(f=fifo, out=tmp_path / "out") for a in command]
    start = time.monotonic()
    run = zckpt(*args, timeout=120)  # a blocking open would hang here until the timeout
    assert run.rc == 2, run.text
    assert str(fifo) in run.err and "not a regular file (a FIFO)" in run.err, run.err
    assert time.monotonic() - start < 60
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not (tmp_path / "out").exists()


def test_directory_source_is_refused(zckpt, tmp_path):
    run = zckpt("ls", tmp_path)  # (verify takes a folder: the containers below it)
    assert run.rc == 2 and "not a regular file (a directory)" in run.err, run.text


# --- item 9: destinations that are not regular files are never replaced ---

def _destinations(tmp_path):
    """name -> (path, how to check it is unchanged), for each kind of non-regular destination."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious.bin"
    target.write_bytes(b"precious")
    made = {}
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)
    made["fifo"] = (fifo, lambda: stat.S_ISFIFO(os.lstat(fifo).st_mode))
    link = tmp_path / "link.out"
    link.symlink_to(target)
    made["symlink"] = (link, lambda: os.path.islink(link) and os.readlink(link) == str(target)
                       and target.read_bytes() == b"precious")
    dangling = tmp_path / "dangling.out"
    dangling.symlink_to(outside / "missing")
    made["dangling symlink"] = (dangling, lambda: os.path.islink(dangling) and not (outside / "missing").exists())
    directory = tmp_path / "dir.out"
    directory.mkdir()
    made["directory"] = (directory, lambda: os.path.isdir(directory) and os.listdir(directory) == [])
    if os.geteuid() == 0:  # a node like /dev/null, made here where replacing it would harm nothing
        null = tmp_path / "null.out"
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made["character device"] = (null, lambda: stat.S_ISCHR(os.lstat(null).st_mode)
                                    and os.lstat(null).st_rdev == os.makedev(1, 3))
    return made


@pytest.mark.parametrize("command", ["convert", "export"])
@pytest.mark.parametrize("force", [False, True])
def test_non_regular_destination_is_refused_and_untouched(zckpt, small, tmp_path, command, force):
    """Without --force an existing destination is refused as existing; with --force too, since
    only a regular file is ever replaced."""
    pt, container = small
    work = tmp_path / "work"
    work.mkdir()
    for kind, (dest, unchanged) in _destinations(work).items():
        before = sorted(os.listdir(work))
        src = pt if command == "convert" else container
        run = zckpt(command, src, "-o", dest, *(["--force"] if force else []), timeout=120)
        assert run.rc == 2, f"{kind}: {run.text}"
        assert str(dest) in run.err, run.err
        if force:
            expected = "symbolic link" if "symlink" in kind else "not a regular file"
            assert expected in run.err, f"{kind}: {run.err}"
        assert unchanged(), f"{command} -o {kind} changed it"
        assert sorted(os.listdir(work)) == before, f"{kind}: left {sorted(os.listdir(work))}"


def test_regular_destination_is_still_replaced(zckpt, small, tmp_path):
    pt, container = small
    dest = tmp_path / "x.pt"
    dest.write_bytes(b"old")
    zckpt.ok("export", container, "-o", dest, "--force")
    assert torch.equal(torch.load(dest)["w"], torch.arange(24.0).reshape(4, 6))


# --- item 2: a file truncated while the CLI reads it ---

@pytest.fixture(scope="module")
def big(zckpt, tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    pt = d / "big.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({f"w{i}": torch.randn(2048, 2048, generator=g) for i in range(4)}, pt)  # 64 MiB
    dst = d / "big.zckpt"
    zckpt.ok("convert", "--quiet", pt, "-o", dst)
    os.unlink(pt)
    return dst


def _wait_until_open(pid, path, timeout=120):
    """Returns once process `pid` holds `path` open (it is past start-up, reading the file)."""
    end = time.monotonic() + timeout
    fds = f"/proc/{pid}/fd"
    while time.monotonic() < end:
        try:
            for fd in os.listdir(fds):
                if os.readlink(os.path.join(fds, fd)) == str(path):
                    return True
        except OSError:
            pass  # exited, or an fd closed while listing
        time.sleep(0.0005)
    return False


@pytest.mark.parametrize("command", [["verify", "--threads", "1"], ["load"], ["load", "--method", "mmap"]])
def test_truncated_while_reading_exits_2_naming_the_file(zckpt, big, tmp_path, command):
    """The file is truncated as soon as the process has it open (found in /proc/PID/fd): the read
    of its data, a few milliseconds later, finds it shorter."""
    if command[0] == "load" and zckpt("load", "--help").rc != 0:
        pytest.skip("zckpt load is not built (no torch)")
    if not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        pytest.skip("needs /proc/PID/fd")
    victim = tmp_path / "victim.zckpt"
    outcomes = []
    for attempt in range(5):
        shutil.copyfile(big, victim)
        p = subprocess.Popen([zckpt.path, *command, str(victim)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        opened = _wait_until_open(p.pid, victim)
        os.truncate(victim, 4096)
        out, err = p.communicate(timeout=300)
        assert p.returncode >= 0, f"zckpt {' '.join(command)} died of signal {-p.returncode}: {err.decode()}"
        outcomes.append((opened, p.returncode, err.decode()[-300:]))
        if opened and p.returncode == 2 and b"changed size" in err:
            assert str(victim).encode() in err
            return
    pytest.fail(f"no run met the truncation while reading: {outcomes}")
