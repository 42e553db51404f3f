"""A load never mixes two checkpoints (issue 22, part 1).

A trainer publishes `latest` by renaming a finished checkpoint over it while other processes
load it. zckpt.load (streamed and mmap=True) and zckpt.load_into must read the pickle, the index
and every storage from one open file: every load below, racing a publisher that renames A or B
over the path in a loop, must equal A or B exactly (its `step` and every tensor), never A's
pickle with B's tensors. Bounded: a fixed number of loads; the publisher stops when told.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import zckpt

LOADS = 40  # per way of loading

PUBLISHER = textwrap.dedent("""
    import os, sys, time
    a, b, latest, stop = sys.argv[1:5]
    tmp = latest + ".publishing"
    i = 1  # `latest` starts as A: B first, then strictly alternating (renaming a link of the
           # same file over it would do nothing, leaving the temporary name behind)
    while not os.path.exists(stop):
        src = a if i % 2 == 0 else b
        os.link(src, tmp)          # a finished checkpoint under a temporary name ...
        os.rename(tmp, latest)     # ... renamed over `latest`, as trainers publish
        i += 1
        time.sleep(0.0005)         # a rename every half millisecond or so: many inside each load
    print(i - 1)
""")


def _state(step):
    g = torch.Generator().manual_seed(step)
    # Several storages of a few MiB: a load spans many reads, so renames land inside loads.
    return {"step": step,
            "model": {f"layer{i}.weight": torch.randn(256, 1024, generator=g) for i in range(6)},
            "bias": torch.full((4096,), float(step)),
            # A pickle that takes zckpt's interpreter a while to vet: renames land in between.
            "history": [{"step": k, "loss": float(k)} for k in range(10000)]}


def _same(loaded, want):
    if loaded["step"] != want["step"] or loaded["model"].keys() != want["model"].keys() or \
            loaded["history"] != want["history"]:
        return False
    return (all(torch.equal(loaded["model"][k], v) for k, v in want["model"].items())
            and torch.equal(loaded["bias"], want["bias"]))


@pytest.fixture
def published(tmp_path):
    states = {1: _state(1), 2: _state(2)}
    a, b = tmp_path / "a.zckpt", tmp_path / "b.zckpt"
    zckpt.save(states[1], a)
    zckpt.save(states[2], b)
    latest, stop = tmp_path / "latest.zckpt", tmp_path / "stop"
    os.link(a, latest)
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(a), str(b), str(latest), str(stop)],
                           stdout=subprocess.PIPE, text=True)
    try:
        yield latest, states
    finally:
        stop.touch()
        out, _ = pub.communicate(timeout=60)
        assert pub.returncode == 0
        assert int(out) > 0, "the publisher never renamed"


@pytest.mark.parametrize("mmap", [False, True], ids=["streamed", "mmap"])
def test_load_racing_a_publisher_is_one_checkpoint(published, mmap):
    latest, states = published
    mixed = []
    for i in range(LOADS):
        loaded = zckpt.load(latest, mmap=mmap)
        step = loaded["step"]
        assert step in states, f"load {i}: step {step!r}"
        if not _same(loaded, states[step]):
            mixed.append(i)
    assert not mixed, f"{len(mixed)} of {LOADS} loads mixed one checkpoint's pickle with the other's tensors"


def _optimizer(lr):
    model = torch.nn.Linear(1024, 1024, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.weight.grad = torch.full_like(model.weight, 1.0)
    opt.step()  # creates the momentum buffer
    with torch.no_grad():
        opt.state[model.weight]["momentum_buffer"].fill_(lr)  # the tensors say which file, as the lr does
    return opt


def test_load_into_an_optimizer_racing_a_publisher_is_one_checkpoint(tmp_path):
    # load_into(optimizer) restores the param_groups (lr) from the pickle and the state tensors
    # from the storages: both must come from the same file.
    paths = {}
    for lr in (0.25, 0.5):
        paths[lr] = tmp_path / f"opt_{lr}.zckpt"
        state = _optimizer(lr).state_dict()
        state["history"] = [{"step": k} for k in range(10000)]  # slow to vet, as above
        zckpt.save(state, paths[lr])
    latest, stop = tmp_path / "latest.zckpt", tmp_path / "stop"
    os.link(paths[0.25], latest)
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(paths[0.25]), str(paths[0.5]), str(latest), str(stop)],
                           stdout=subprocess.PIPE, text=True)
    try:
        target = _optimizer(1.0)
        mixed = 0
        for i in range(LOADS // 2):
            zckpt.load_into(latest, target, weights_only=False)
            lr = target.param_groups[0]["lr"]
            buf = next(iter(target.state.values()))["momentum_buffer"]
            assert lr in paths, f"load_into {i}: lr {lr}"
            if not torch.equal(buf, torch.full_like(buf, lr)):
                mixed += 1
        assert mixed == 0, f"{mixed} of {LOADS // 2} load_into calls took one file's lr with the other's tensors"
    finally:
        stop.touch()
        out, _ = pub.communicate(timeout=60)
    assert pub.returncode == 0 and int(out) > 0


# FSDP1's load_into reads the records of the rank file, then its buffers whole and its
# FlatParameter rows as element runs: from one open file, so a rename in between mixes nothing.
# One gloo rank in a child process (the group stays out of pytest's process).
FSDP1_WORKER = textwrap.dedent("""
    import os, subprocess, sys, warnings
    import torch
    sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "..", "..", "tools", "examples")]
    from fsdp_cases import build, join_group, state_ctx
    from verl_resume import free_port
    import zckpt
    root, publisher, loads = sys.argv[2], sys.argv[3], int(sys.argv[4])
    join_group(0, 1, free_port())

    def fill(model, v):
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.fill_(v)

    model, _ = build("fsdp1", 0)
    paths = {}
    for v in (1.0, 2.0):  # checkpoint A: every saved value 1.0; B: 2.0
        fill(model, v)
        pt = os.path.join(root, f"{v}.pt")
        with state_ctx(model):
            torch.save(model.state_dict(), pt)
        paths[v] = os.path.join(root, f"{v}.zckpt")
        zckpt.convert(pt, paths[v])
    latest = os.path.join(root, "latest", "model_world_size_1_rank_0.zckpt")
    os.makedirs(os.path.dirname(latest))
    os.link(paths[1.0], latest)
    stop = os.path.join(root, "stop")
    pub = subprocess.Popen([sys.executable, "-c", publisher, paths[1.0], paths[2.0], latest, stop],
                           stdout=subprocess.PIPE, text=True)
    seen, mixed = set(), 0
    try:
        for i in range(loads):
            fill(model, 0.0)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # in place, never FSDP's fallback
                zckpt.load_into(latest, model)
            with state_ctx(model, full=True):
                values = {float(x) for t in model.state_dict().values() for x in t.flatten().unique()}
            seen |= values
            mixed += values not in ({1.0}, {2.0})
    finally:
        open(stop, "w").close()
        out, _ = pub.communicate(timeout=60)
    print("renames", int(out), "seen", sorted(seen), "mixed", mixed)
""")


def test_fsdp1_load_into_racing_a_publisher_is_one_checkpoint(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", FSDP1_WORKER, here, str(tmp_path), PUBLISHER, str(LOADS)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    words = r.stdout.split()
    renames, mixed = int(words[words.index("renames") + 1]), int(words[words.index("mixed") + 1])
    assert renames > 0, r.stdout
    assert "[1.0, 2.0]" in r.stdout, f"the loads never saw both checkpoints: {r.stdout}"
    assert mixed == 0, f"{mixed} of {LOADS} FSDP1 load_into calls mixed the two checkpoints: {r.stdout}"
