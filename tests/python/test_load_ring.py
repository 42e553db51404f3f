"""The loader's ring from Python: zckpt.load and zckpt.load_into take threads=, slots= and
slot_bytes=, the names of `zckpt load --threads --slots --slot-bytes` (issue 23, part 5).

Each keyword must reach the C++ loader, not just be accepted: slot_bytes is seen in the size of
the slot the loader tries to allocate, threads in the reader threads the loader reports it ran,
and every ring shape must give back exactly what torch.load gives.
"""

import json

import pytest
import torch

import zckpt
from zckpt_testing import run_cli


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A torch.save file of many storages, small (packed into ring slots) and large (read
    straight into their CPU destinations), converted with 64 KiB chunks: a load of it spans
    many chunks and batches."""
    root = tmp_path_factory.mktemp("ring")
    g = torch.Generator().manual_seed(7)
    state = {f"small{i}": torch.randn(100 + i, generator=g) for i in range(40)}
    state.update({f"big{i}": torch.randn(512, 1024, generator=g) for i in range(24)})  # 2 MiB each
    pt, zk = root / "state.pt", root / "state.zckpt"
    torch.save(state, pt)
    zckpt.convert(pt, zk, chunk_bytes=64 << 10)
    return zk, state


def _equal(got, want):
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("ring", [dict(threads=1, slots=1, slot_bytes=4096), dict(threads=3, slots=2),
                                  dict(threads=8, slot_bytes=1 << 20), {}],
                         ids=["one-slot", "three-readers", "eight-readers", "defaults"])
def test_every_ring_gives_what_torch_saved(converted, ring):
    path, state = converted
    _equal(zckpt.load(path, **ring), state)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    assert zckpt.load_into(path, target, **ring) == ([], [])
    _equal(target, state)


def test_mmap_takes_threads(converted):
    path, state = converted
    _equal(zckpt.load(path, mmap=True, threads=1), state)
    _equal(zckpt.load(path, mmap=True, threads=5), state)


def test_slot_bytes_reaches_the_loader(converted):
    # A 4 TiB slot cannot be allocated: the loader's refusal names the slot size asked for (the
    # small storages need a slot), which only happens if slot_bytes got there.
    path, state = converted
    for call in (lambda: zckpt.load(path, slot_bytes=1 << 42),
                 lambda: zckpt.load_into(path, {k: torch.zeros_like(v) for k, v in state.items()}, slot_bytes=1 << 42)):
        with pytest.raises(zckpt.OutOfMemoryError, match=r"cannot allocate a 43980465\d+-byte ring slot"):
            call()


def _reader_threads(load, monkeypatch):
    """The reader threads each load_ranges call of `load` ran, as the loader reports them
    (LoadStats.threads: the threads it started, at most one per batch)."""
    from zckpt import _core

    seen, real = [], _core.Checkpoint.load_ranges

    def spy(self, *args, **kwargs):
        stats = real(self, *args, **kwargs)
        seen.append(stats["threads"])
        return stats

    monkeypatch.setattr(_core.Checkpoint, "load_ranges", spy)
    load()
    monkeypatch.setattr(_core.Checkpoint, "load_ranges", real)
    return seen


def test_threads_reaches_the_loader(converted, monkeypatch):
    # Counted by the loader, not by sampling /proc/self/task: on a busy machine a sampler can
    # miss readers that start and finish between two of its looks.
    path, _ = converted
    # 1 MiB batches: many more batches than readers, so every reader asked for is started.
    assert set(_reader_threads(lambda: zckpt.load(path, threads=1, slot_bytes=1 << 20), monkeypatch)) == {1}
    assert set(_reader_threads(lambda: zckpt.load(path, threads=8, slot_bytes=1 << 20), monkeypatch)) == {8}


@pytest.mark.parametrize("kw", [dict(threads=-1), dict(slots=1.5), dict(slot_bytes="8M"), dict(threads=True)])
def test_bad_ring_keywords_are_refused_by_name(converted, kw):
    path, state = converted
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        zckpt.load(path, **kw)
    with pytest.raises(ValueError, match=name):
        zckpt.load_into(path, {k: torch.zeros_like(v) for k, v in state.items()}, **kw)


def test_zero_and_none_are_the_default_in_python_and_the_command(converted, monkeypatch, tmp_path):
    """One rule for sizes and threads (README, "Python"): None, 0 and leaving them out all give
    the default ring, in zckpt.load, load_into, verify, convert and save, and in `zckpt load`,
    `zckpt verify` and `zckpt convert` alike."""
    path, state = converted
    default = _reader_threads(lambda: zckpt.load(path), monkeypatch)
    assert _reader_threads(lambda: zckpt.load(path, threads=None, slots=None, slot_bytes=None), monkeypatch) == default
    assert _reader_threads(lambda: zckpt.load(path, threads=0, slots=0, slot_bytes=0), monkeypatch) == default
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    assert zckpt.load_into(path, target, threads=0, slots=0, slot_bytes=0) == ([], [])
    _equal(target, state)
    assert zckpt.verify(path, threads=0) == zckpt.verify(path, threads=None) == []

    ring = ("threads", "slots", "slot_bytes")
    plain = run_cli("load", path, "--json")
    zero = run_cli("load", path, "--json", "--threads", "0", "--slots", "0", "--slot-bytes", "0")
    assert plain.returncode == zero.returncode == 0, zero.stderr
    assert [json.loads(zero.stdout)[k] for k in ring] == [json.loads(plain.stdout)[k] for k in ring]
    assert run_cli("verify", "--threads", "0", path).returncode == 0
    assert run_cli("load", path, "--threads", "-1").returncode == 2

    pt = tmp_path / "state.pt"
    torch.save(state, pt)
    made = {}
    for how, kw, args in (("unset", {}, []), ("none", dict(chunk_bytes=None, threads=None), None),
                          ("zero", dict(chunk_bytes=0, threads=0), ["--chunk-bytes", "0", "--threads", "0"])):
        made[how] = tmp_path / f"{how}.zckpt"
        zckpt.convert(pt, made[how], **kw)
        if args is not None:
            cli = tmp_path / f"{how}-cli.zckpt"
            assert run_cli("convert", pt, "-o", cli, *args).returncode == 0
            made[how + "-cli"] = cli
        saved = tmp_path / f"{how}-saved.zckpt"
        zckpt.save(state, saved, **kw)
        made[how + "-saved"] = saved
    sizes = {how: json.loads(run_cli("ls", "--json", p).stdout)["chunk_bytes"] for how, p in made.items()}
    assert set(sizes.values()) == {4 << 20}, sizes
