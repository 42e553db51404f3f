"""Helpers shared by the framework tests (not a test module): running a worker script in a process
of its own (Worker), checking that every file a framework wrote is a container `zckpt verify` passes,
damaging one chunk of a container."""
import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from zckpt_testing import flip_byte, ls_json, run_cli  # noqa: E402

# How long one worker process may take (a framework's import, a few tiny epochs, DDP's start).
WORKER_TIMEOUT_S = 300
# Two ranks on the CPU (gloo); --standalone rendezvous on a free local port (`--master_port 0` left the
# workers hanging here).
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


class Worker:
    """A worker script of this folder, each run in a process of its own: `python SCRIPT CONFIG.json`,
    under torchrun for two ranks. The worker writes rank 0's outcome as JSON to config["out"]."""

    def __init__(self, script):
        self.script = os.path.join(HERE, script)

    def run(self, tmp_path, name, ranks=1, **config):
        """(returncode, the JSON rank 0 wrote or None, the process's output) of one run named `name`."""
        out = os.path.join(str(tmp_path), f"{name}.out.json")
        cfg = os.path.join(str(tmp_path), f"{name}.json")
        with open(cfg, "w") as f:
            json.dump(dict(config, out=out), f)
        launcher = TORCHRUN if ranks == 2 else (sys.executable,)
        # A session of its own, so that a run past its time is killed with every rank it started.
        proc = subprocess.Popen([*launcher, self.script, cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            output += f"\n(killed after {WORKER_TIMEOUT_S} s)"
        result = json.load(open(out)) if os.path.exists(out) else None
        return proc.returncode, result, output

    def ok(self, tmp_path, name, ranks=1, **config):
        """The JSON rank 0 wrote, of a run that must succeed (its output shown when it failed)."""
        rc, result, output = self.run(tmp_path, name, ranks, **config)
        assert rc == 0 and result is not None and "error" not in result, output[-4000:]
        return result


def memoized(make):
    """make(key) made once per key: the uninterrupted runs a test module compares against (one
    per world size)."""
    made = {}

    def get(key=1):
        if key not in made:
            made[key] = make(key)
        return made[key]

    return get


def assert_stopped_by_corruption(run, damaged, watched, exit_code=3):
    """A resume `run` ((returncode, result, output) of Worker.run) over a container `damaged` with
    a flipped byte: the worker exited 3 (torchrun, whose ranks exit 3, exits 1: exit_code=1) with
    zckpt.CorruptError naming that file and its chunk, no training step ran, and nothing under the
    folder `watched` changed."""
    before = files_under(watched)
    rc, result, output = run()
    assert rc == exit_code and result is not None, output[-4000:]
    assert result["error"] == "CorruptError", result
    assert result["file"] == damaged and result["chunk"] is not None, result
    assert os.path.basename(damaged) in result["message"] and "chunk" in result["message"], result["message"]
    assert result["losses"] == [], "training went on after the damaged checkpoint"
    assert files_under(watched) == before, "the failed resume wrote or removed files"


def assert_containers(paths):
    """Every path is a container that `zckpt verify` passes."""
    assert paths, "no checkpoint files written"
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89ZCK\r\n\x1a\n", f"{path} is not a container"
        r = run_cli("verify", path)
        assert r.returncode == 0, f"zckpt verify {path}: {r.stdout}{r.stderr}"


def flip_storage_byte(path, storage=0):
    """Flips one byte in the middle of the payload of the container's `storage`-th storage;
    returns that storage's record."""
    record = ls_json(path)["storages"][storage]
    flip_byte(path, record["offset"] + record["bytes"] // 2)
    return record


def files_under(folder):
    """{relative path: (size, mtime_ns)} of every file under `folder` (what a run that must not
    go on must leave unchanged)."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            st = os.lstat(p)
            out[os.path.relpath(p, folder)] = (st.st_size, st.st_mtime_ns)
    return out
