"""The loader's ring from Python: zckpt.load and zckpt.load_into take threads=, slots= and
slot_bytes=, the names of `zckpt load --threads --slots --slot-bytes` (issue 23, part 5).

Each keyword must reach the C++ loader, not just be accepted: slot_bytes is seen in the size of
the slot the loader tries to allocate, threads in the reader threads the loader reports it ran,
and every ring shape must give back exactly what torch.load gives.
"""

import pytest
import torch

import zckpt


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
