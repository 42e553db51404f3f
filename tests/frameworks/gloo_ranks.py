"""What the multi-rank framework tests share (not a test module): starting a worker script as
gloo ranks and reading what each rank reported, a worker's result file and its exit, the zckpt command, a flipped byte inside a
container's chunk, and a bit-for-bit comparison of training state.

A worker is started as `python SCRIPT RANK WORLD_SIZE PORT PHASE ROOT [EXTRA...]` and writes
ROOT/<PHASE>[_EXTRA...]_rank<RANK>.json: check name -> None or the problem, or "worker raised"
with its traceback."""
import json
import os
import socket
import subprocess
import sys

import torch

# Seconds one phase of ranks may take: a 2-core VM shared with builds runs the slowest phases in
# a few minutes.
PHASE_TIMEOUT_S = 600
# Seconds one zckpt command may take.
CLI_TIMEOUT_S = 300


def write_result(path, result):
    """A worker's result as JSON at `path`, the file closed (finish may end the process next)."""
    with open(path, "w") as f:
        json.dump(result, f)


def finish(code):
    """Ends a worker rank with `code` without the interpreter's teardown: under FSDP over gloo,
    the teardown of the process group's threads can abort a process whose run succeeded
    (std::terminate, "terminate called without an active exception"), which is torch's exit and
    not what the tests check."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(script, ws, phase, root, *extra, env=None, timeout=PHASE_TIMEOUT_S):
    """Runs `script` as ranks 0..ws-1 of one gloo group; returns {rank: its results}."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, script, str(r), str(ws), port, phase, root, *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(ws)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    name = "_".join((phase, *extra))
    results = {}
    for r in range(ws):
        path = os.path.join(root, f"{name}_rank{r}.json")
        assert os.path.exists(path), f"rank {r} wrote no results: {outs[r][-3000:]}"
        with open(path) as f:
            results[r] = json.load(f)
        assert "worker raised" not in results[r], results[r]["worker raised"]
    return results


def cli(*args):
    return subprocess.run([os.environ.get("ZCKPT_BIN", "zckpt"), *map(str, args)], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def flip_chunk_byte(path):
    """Flips one bit in the middle of the container's largest storage (inside a chunk's payload,
    stored raw)."""
    storage = max(json.loads(cli("ls", "--json", path).stdout)["storages"], key=lambda s: s["bytes"])
    with open(path, "r+b") as f:
        f.seek(storage["offset"] + storage["bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))


def differs(a, b, path=""):
    """None when equal bit for bit (tensors: dtype, shape and values), else where they first differ."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return f"{path}: keys differ"
        for k in a:
            d = differs(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return None if same else f"{path}: differs"
    return None if a == b else f"{path}: {a!r} != {b!r}"
