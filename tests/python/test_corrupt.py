"""A damaged container: one byte flipped inside a storage's payload (found with `zckpt ls
--json`: storages[i].offset). load, load_into and verify raise zckpt.CorruptError naming the
tensor and the file; verify=False reads the damaged byte through, showing it was the payload."""
import collections
import os
import shutil
import zipfile

import pytest
import torch

import zckpt
from zckpt_testing import flip_byte, run_cli, save_converted, storage_of

VICTIM = "layers.3.mlp.weight"


def _state():
    g = torch.Generator().manual_seed(0)
    return collections.OrderedDict([
        ("embed.weight", torch.randn(64, 32, generator=g)),
        (VICTIM, torch.randn(128, 256, generator=g)),  # 128 KiB: a large, 4 KiB-aligned storage
        ("norm.weight", torch.ones(32)),
    ])


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    state = _state()
    _, path = save_converted(state, tmp_path_factory.mktemp("good"), "model")
    return state, path


@pytest.fixture
def damaged(good, tmp_path):
    """(state, path, index of the flipped byte inside the victim's storage)."""
    state, src = good
    path = str(tmp_path / "damaged.zckpt")
    shutil.copyfile(src, path)
    storage = storage_of(path, VICTIM)
    assert storage["bytes"] == 128 * 256 * 4
    inside = storage["bytes"] // 2 + 3
    flip_byte(path, storage["offset"] + inside)
    return state, path, inside


def _assert_names_tensor_and_file(err, path):
    msg = str(err)
    assert VICTIM in msg, msg
    assert path in msg, msg


def test_verify_good_file_is_empty(good):
    assert zckpt.verify(good[1]) == []
    assert zckpt.verify(good[1], raise_on_error=False) == []


def test_load_raises(damaged):
    _, path, _ = damaged
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load(path, weights_only=True)
    _assert_names_tensor_and_file(e.value, path)


def test_load_into_raises(damaged):
    _, path, _ = damaged
    target = {k: torch.zeros_like(v) for k, v in _state().items()}
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load_into(path, target)
    _assert_names_tensor_and_file(e.value, path)


def test_verify_raises_and_lists(damaged):
    _, path, inside = damaged
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.verify(path)
    _assert_names_tensor_and_file(e.value, path)
    problems = zckpt.verify(path, raise_on_error=False)
    assert len(problems) == 1 and VICTIM in problems[0]
    # The problem keeps its structure: the bad chunk's place, as fields, and as the error's own.
    (found,) = e.value.problems
    storage = storage_of(path, VICTIM)
    flipped = storage["offset"] + inside
    assert found["kind"] == "corrupt" and found["message"] == problems[0] == str(e.value)
    assert found["file"] == path and found["storage"] == storage["key"] and VICTIM in found["tensors"]
    assert isinstance(found["chunk"], int) and f"chunk {found['chunk']}," in found["message"]
    assert found["file_bytes"][0] <= flipped < found["file_bytes"][1], found
    assert found["storage_bytes"][0] <= inside < found["storage_bytes"][1], found
    for field in ("file", "storage", "tensors", "chunk", "file_bytes", "storage_bytes"):
        assert getattr(e.value, field) == found[field], field


def test_every_load_path_places_the_bad_chunk(damaged):
    """A CorruptError from any load names the bad chunk as attributes, as verify's does: the
    streamed load, the in-place load, the verified mapping and iter_tensors each check chunks
    through the one chunk checker and raise Container::ChunkError."""
    _, path, inside = damaged
    storage = storage_of(path, VICTIM)
    flipped = storage["offset"] + inside
    target = {k: torch.zeros_like(v) for k, v in _state().items()}
    calls = {
        "load": lambda: zckpt.load(path),
        "load_into": lambda: zckpt.load_into(path, target),
        "mmap": lambda: zckpt.load(path, mmap=True),
        "iter_tensors": lambda: list(zckpt.iter_tensors(path)),
    }
    for name, call in calls.items():
        with pytest.raises(zckpt.CorruptError) as e:
            call()
        err = e.value
        assert err.file == path and err.storage == storage["key"] and VICTIM in err.tensors, (name, str(err))
        assert isinstance(err.chunk, int) and f"chunk {err.chunk}," in str(err), (name, str(err))
        assert err.file_bytes[0] <= flipped < err.file_bytes[1], (name, err.file_bytes)
        assert err.storage_bytes[0] <= inside < err.storage_bytes[1], (name, err.storage_bytes)


def test_errors_carry_their_place_as_attributes(tmp_path):
    """Every ZckptError has the place attributes: set from the C++ error's place (verify of a
    folder holding no container names the folder), None where an error is about no place."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(zckpt.ZckptError, match="no zckpt container below this folder") as e:
        zckpt.verify(empty)
    assert e.value.file == str(empty) and e.value.chunk is None and e.value.tensors is None
    for kind in (zckpt.ZckptError, zckpt.CorruptError, zckpt.UnsafeError, zckpt.OutOfMemoryError):
        assert all(getattr(kind, f) is None for f in ("file", "storage", "tensors", "chunk", "file_bytes",
                                                      "storage_bytes")), kind


def test_cli_verify_exit_code(good, damaged):
    _, path, _ = damaged
    assert run_cli("verify", "--quiet", good[1]).returncode == 0
    r = run_cli("verify", path)
    assert r.returncode == 1
    assert VICTIM in r.stdout + r.stderr


def test_verify_false_reads_the_flipped_byte(damaged):
    """The flip landed in the victim's bytes and nowhere else."""
    state, path, inside = damaged
    got = zckpt.load(path, weights_only=True, verify=False)
    for k in ("embed.weight", "norm.weight"):
        assert torch.equal(got[k], state[k]), k
    a = got[VICTIM].view(torch.uint8).reshape(-1)
    b = state[VICTIM].view(torch.uint8).reshape(-1)
    differ = (a != b).nonzero().flatten().tolist()
    assert differ == [inside]
    assert a[inside].item() == b[inside].item() ^ 0xFF
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    zckpt.load_into(path, target, verify=False)
    assert (target[VICTIM].view(torch.uint8).reshape(-1) != b).nonzero().flatten().tolist() == [inside]


def test_compressed_chunk_damaged(tmp_path):
    state = collections.OrderedDict([(VICTIM, torch.zeros(256, 1024)), ("b", torch.arange(8.0))])
    state[VICTIM][::7, ::13] = 1.5
    pt = str(tmp_path / "z.pt")
    torch.save(state, pt)
    path = str(tmp_path / "z.zckpt")
    assert zckpt.convert(pt, path, zstd_level=3)["compressed_chunks"] >= 1
    assert torch.equal(zckpt.load(path)[VICTIM], state[VICTIM])
    storage = storage_of(path, VICTIM)
    flip_byte(path, storage["offset"] + 40)
    for call in (lambda: zckpt.load(path), lambda: zckpt.verify(path),
                 lambda: zckpt.load(path, verify=False),  # zstd frames are always checked
                 lambda: zckpt.load_into(path, {k: torch.zeros_like(v) for k, v in state.items()})):
        with pytest.raises(zckpt.CorruptError) as e:
            call()
        _assert_names_tensor_and_file(e.value, path)


def test_damaged_pickle_blob(good, tmp_path):
    state, src = good
    path = str(tmp_path / "pkl.zckpt")
    shutil.copyfile(src, path)
    pt = os.path.join(os.path.dirname(src), "model.pt")
    with zipfile.ZipFile(pt) as z:
        pkl = z.read("model/data.pkl")
    with open(path, "rb") as f:
        at = f.read().find(pkl)
    assert at > 0, "data.pkl is not stored verbatim in the container"
    flip_byte(path, at + len(pkl) // 2)
    with pytest.raises(zckpt.CorruptError, match="data.pkl"):
        zckpt.load(path)
    assert zckpt.verify(path, raise_on_error=False)


def test_truncated_file(good, tmp_path):
    path = str(tmp_path / "short.zckpt")
    with open(good[1], "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load(path)
    assert path in str(e.value)


def test_not_a_container(good):
    pt = os.path.join(os.path.dirname(good[1]), "model.pt")
    with pytest.raises(zckpt.ZckptError) as e:
        zckpt.load(pt)
    assert pt in str(e.value)
    with pytest.raises(zckpt.ZckptError):
        zckpt.load(pt + ".missing")


def test_flip_in_the_last_block_of_a_chunk_read_in_place(tmp_path):
    """A chunk read straight into its destination is hashed piece by piece as its bytes land (each
    512 KiB piece right after its read, while in cache); the chunk is judged only once its last
    piece is in: a flip in the last byte of a middle chunk fails load_into and names that chunk,
    its file range ending just past the flipped byte."""
    g = torch.Generator().manual_seed(1)
    state = {"big": torch.randn(1024, 1024, generator=g), "norm": torch.ones(8)}  # 4 MiB: 4 chunks of 1 MiB
    pt = str(tmp_path / "m.pt")
    torch.save(state, pt)
    path = str(tmp_path / "m.zckpt")
    zckpt.convert(pt, path, chunk_bytes=1 << 20)
    storage = storage_of(path, "big")
    flipped = storage["offset"] + (2 << 20) - 1  # the last byte of chunk 1 of the storage
    flip_byte(path, flipped)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    with pytest.raises(zckpt.CorruptError) as e:
        zckpt.load_into(path, target)
    err = e.value
    assert err.file == path and "big" in err.tensors, str(err)
    assert err.file_bytes == (storage["offset"] + (1 << 20), flipped + 1), (err.file_bytes, str(err))
    assert err.storage_bytes == (1 << 20, 2 << 20), err.storage_bytes
    # Unverified, the flipped byte is what lands: the check, not the read, caught it.
    zckpt.load_into(path, target, verify=False)
    diff = (target["big"].view(torch.uint8).reshape(-1) != state["big"].view(torch.uint8).reshape(-1)).nonzero()
    assert diff.reshape(-1).tolist() == [(2 << 20) - 1]
