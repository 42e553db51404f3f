"""zckpt.load on files that are not what they should be (issue 11): a FIFO is refused without
blocking, and a file truncated by another thread while it loads raises ZckptError naming it
instead of killing the interpreter with SIGBUS."""
import os
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
    """A thread truncates the file right after zckpt.load opens it for the n-th time (it opens
    the container to describe it, to read the pickle, then to stream the storages): every outcome
    is the state dict or ZckptError, and the streaming read meets the truncation at least once."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    victim = tmp_path / "victim.zckpt"
    expected = torch.load(str(shard).replace(".zckpt", ".pt"), weights_only=True)
    shrank = 0
    for nth_open in (3, 3, 2, 1, 3):
        victim.write_bytes(shard.read_bytes())
        done = threading.Event()

        def cut():
            seen = 0
            was_open = False
            while not done.is_set():
                now_open = _opens_of(victim) > 0
                if now_open and not was_open:
                    seen += 1
                    if seen == nth_open:
                        os.truncate(victim, 4096)
                        return
                was_open = now_open
                time.sleep(0.0002)

        t = threading.Thread(target=cut)
        t.start()
        try:
            got = zckpt.load(victim, **kwargs)
            assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
        except zckpt.ZckptError as e:
            assert str(victim) in str(e), str(e)
            shrank += "changed size" in str(e)
        finally:
            done.set()
            t.join()
    assert shrank > 0, "no load met the truncation while streaming"
