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
