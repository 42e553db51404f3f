"""zckpt.load on files that are not what they should be (issue 11): a FIFO is refused without
blocking, and a file truncated by another thread while it loads raises ZckptError naming it
instead of killing the interpreter with SIGBUS. The DCP and reshard helpers' own files (DCP's
.metadata, a verl folder's other files) follow the same rules."""
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import zckpt


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    d = tmp_path_factory.mktemp("shard")
    pt = d / "shard.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(16)}, pt)  # 64 MiB
    dst = d / "shard.zckpt"
    zckpt.convert(str(pt), str(dst))
    return dst


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.zckpt"
    os.mkfifo(fifo)
    # In a child: a blocking open would hang it, and the timeout turns that into a failure here.
    code = ("import zckpt, sys\n"
            "try:\n"
            "    zckpt.load(sys.argv[1])\n"
            "except zckpt.ZckptError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    assert str(fifo) in p.stdout and "not a regular file (a FIFO)" in p.stdout


def _opens_of(path):
    """How many descriptors of this process name `path` right now."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return n


@pytest.mark.parametrize("kwargs", [{}, {"verify": False}])
def test_truncated_while_loading_raises_naming_the_file(shard, tmp_path, kwargs):
    """A thread truncates the file as soon as it sees zckpt.load holding it open (it can look
    while the storages stream: that call releases the GIL; the earlier ones, describing the
    container and reading its pickle, do not): every outcome is the state dict or ZckptError
    naming the file, and the streaming read meets the truncation."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    victim = tmp_path / "victim.zckpt"
    expected = torch.load(str(shard).replace(".zckpt", ".pt"), weights_only=True)
    outcomes = []
    for delay in (0, 0, 0.0005, 0, 0.001, 0, 0.002, 0):
        victim.write_bytes(shard.read_bytes())
        done = threading.Event()

        def cut():
            while not done.is_set():
                if _opens_of(victim) > 0:
                    time.sleep(delay)
                    os.truncate(victim, 4096)
                    return
                time.sleep(0.0001)

        t = threading.Thread(target=cut)
        t.start()
        try:
            got = zckpt.load(victim, **kwargs)
            assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
            outcomes.append("loaded")
        except zckpt.ZckptError as e:
            assert str(victim) in str(e), str(e)
            outcomes.append(str(e))
        finally:
            done.set()
            t.join()
        if "changed size" in outcomes[-1]:
            return
    pytest.fail(f"no load met the truncation while streaming: {[o[:200] for o in outcomes]}")


def _in_child(code, *args):
    """Runs `code` in a child (a blocking open would hang it; the timeout makes that a failure)
    and returns (exit status, stdout). The code prints a ZckptError and exits 3."""
    wrapped = "import sys, zckpt\ntry:\n" + "".join("    " + line + "\n" for line in code.splitlines()) + \
        "except zckpt.ZckptError as e:\n    print(e)\n    sys.exit(3)\n"
    p = subprocess.run([sys.executable, "-c", wrapped, *map(str, args)], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def test_dcp_metadata_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / ".metadata")
    rc, out = _in_child("from zckpt import dcp\ndcp.load_metadata(sys.argv[1])", tmp_path)
    assert rc == 3, out
    assert str(tmp_path / ".metadata") in out and "not a regular file (a FIFO)" in out


def test_dcp_metadata_write_replaces_only_a_regular_file(tmp_path):
    from zckpt import dcp
    fifo = tmp_path / ".metadata"
    os.mkfifo(fifo)
    with pytest.raises(zckpt.ZckptError, match="not a regular file"):
        dcp._write_atomic(fifo, b"metadata")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    regular = tmp_path / "other"
    regular.write_bytes(b"old")
    dcp._write_atomic(regular, b"new")
    assert regular.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == [".metadata", "other"]  # no temporary left


def test_reshard_copies_only_regular_files_and_replaces_only_regular_files(tmp_path):
    from zckpt import reshard
    ck, out = tmp_path / "ck", tmp_path / "out"
    (ck / "huggingface").mkdir(parents=True)
    (ck / "fsdp_config.json").write_text('{"world_size": 2, "other": 1}')
    (ck / "huggingface" / "config.json").write_text("{}")
    reshard._copy_rest(str(ck), str(out), set(), 4)
    assert json.loads((out / "fsdp_config.json").read_text()) == {"world_size": 4, "other": 1}
    assert (out / "huggingface" / "config.json").read_text() == "{}"
    os.mkfifo(ck / "huggingface" / "tokenizer.json")
    rc, text = _in_child("from zckpt import reshard\nreshard._copy_rest(sys.argv[1], sys.argv[2], set(), 4)", ck, out)
    assert rc == 3, text
    assert "tokenizer.json: not a regular file (a FIFO)" in text
    assert not os.path.lexists(out / "huggingface" / "tokenizer.json")
    os.unlink(ck / "huggingface" / "tokenizer.json")
    os.mkfifo(out / "model_world_size_4_rank_0.pt")
    src = tmp_path / "new.pt"
    src.write_bytes(b"x")
    with pytest.raises(zckpt.ZckptError, match="not a regular file"):
        reshard._replace_regular(str(src), str(out / "model_world_size_4_rank_0.pt"))
    assert stat.S_ISFIFO(os.lstat(out / "model_world_size_4_rank_0.pt").st_mode) and src.exists()
