"""zckpt.load(mmap=True): CPU tensors equal to torch.load's whose bytes lie inside a private
(copy-on-write) mapping of the container: nothing copied, writes never reach the file."""
import gc
import os
import shutil
import subprocess
import sys

import pytest
import torch

import zckpt
from torch_family import assert_deep_equal
from zckpt_testing import ls_json, mapped_ranges, sha256, storage_ptrs, tensors_in



def _inside(ptr, nbytes, ranges):
    return any(start <= ptr and ptr + nbytes <= end for start, end in ranges)


@pytest.fixture
def container(family, tmp_path):
    """A private copy of a converted family file (tests here write and unlink)."""
    def copy(name):
        dst = tmp_path / (name + ".zckpt")
        shutil.copyfile(family.zckpt(name), dst)
        return str(dst)
    return copy


@pytest.mark.parametrize("name", ["dtypes.pt", "shared_storage.pt", "strides.pt", "scalars_empty.pt",
                                  "legacy.pt", "module_state_dict.pt", "rng_states.pt"])
def test_mmap_equals_torch_load(family, name):
    got = zckpt.load(family.zckpt(name), mmap=True, weights_only=False)
    assert_deep_equal(got, family.torch_load(name))
    assert {t.device.type for t in tensors_in(got)} == {"cpu"}


@pytest.mark.parametrize("name", ["dtypes.pt", "shared_storage.pt", "legacy.pt"])
def test_mmap_data_lies_in_the_file_mapping(container, name):
    path = container(name)
    assert mapped_ranges(path) == []
    got = zckpt.load(path, mmap=True, weights_only=False)
    ranges = mapped_ranges(path)
    assert ranges, "no mapping of the container in /proc/self/maps"
    checked = 0
    for t in tensors_in(got):
        s = t.untyped_storage()
        if s.nbytes():
            assert _inside(s.data_ptr(), s.nbytes(), ranges), f"storage of {tuple(t.shape)} {t.dtype} not in the mapping"
            checked += 1
    assert checked >= 8


def test_mmap_shares_no_memory_with_a_regular_load(container):
    path = container("shared_storage.pt")
    mapped = zckpt.load(path, mmap=True, weights_only=False)
    loaded = zckpt.load(path, weights_only=False)
    assert_deep_equal(mapped, loaded)
    assert len(storage_ptrs(mapped)) == len(storage_ptrs(loaded)) == 3
    assert storage_ptrs(mapped).isdisjoint(storage_ptrs(loaded))
    ranges = mapped_ranges(path)
    assert not any(_inside(p, 1, ranges) for p in storage_ptrs(loaded))


def test_mmap_writes_never_reach_the_file(container):
    path = container("module_state_dict.pt")
    before = sha256(path)
    first = zckpt.load(path, mmap=True, weights_only=False)
    original = {k: v.clone() for k, v in first.items()}
    with torch.no_grad():
        for v in first.values():
            if v.dtype.is_floating_point:
                v.add_(1.0)
    assert not torch.equal(first["norm.weight"], original["norm.weight"])
    assert sha256(path) == before
    second = zckpt.load(path, mmap=True, weights_only=False)
    assert all(torch.equal(second[k], original[k]) for k in original)
    assert_deep_equal(zckpt.load(path, weights_only=False), second)


def test_mmap_outlives_the_file_name(container):
    path = container("strides.pt")
    got = zckpt.load(path, mmap=True, weights_only=False)
    want = {k: v.clone() for k, v in got.items()}
    os.remove(path)
    gc.collect()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_mapping_released_with_the_tensors(container):
    path = container("dtypes.pt")
    got = zckpt.load(path, mmap=True, weights_only=False)
    assert mapped_ranges(path)
    del got
    gc.collect()
    assert mapped_ranges(path) == []


def test_mmap_of_zstd_chunks_decodes_into_owned_memory(family, tmp_path):
    path = str(tmp_path / "compressible.zckpt")
    stats = zckpt.convert(family.pt("compressible.pt"), path, zstd_level=3)
    assert stats["compressed_chunks"] >= 1
    got = zckpt.load(path, mmap=True, weights_only=False)
    assert_deep_equal(got, family.torch_load("compressible.pt"))
    big = got["compressible"].untyped_storage()
    assert not _inside(big.data_ptr(), big.nbytes(), mapped_ranges(path))


@pytest.mark.parametrize("map_location", ["cuda:0", torch.device("meta"), {"cpu": "cuda:0"}])
def test_mmap_refuses_non_cpu_map_location(family, map_location):
    with pytest.raises(ValueError, match="mmap"):
        zckpt.load(family.zckpt("strides.pt"), mmap=True, map_location=map_location)


@pytest.mark.parametrize("map_location", [None, "cpu", torch.device("cpu")])
def test_mmap_accepts_cpu_map_location(family, map_location):
    got = zckpt.load(family.zckpt("strides.pt"), mmap=True, map_location=map_location, weights_only=True)
    assert_deep_equal(got, family.torch_load("strides.pt", weights_only=True))


def test_mmap_verify_checks_every_chunk_in_the_mapping(container):
    """verify=True (the default) hashes every chunk where it lies in the mapping: a flipped bit
    in any tensor's bytes raises CorruptError naming the file; verify=False maps it unchecked.
    Checked, the tensors still alias the mapping."""
    path = container("module_state_dict.pt")
    good = zckpt.load(path, mmap=True, weights_only=False)
    ranges = mapped_ranges(path)
    assert all(_inside(p, 1, ranges) for p in storage_ptrs(good))
    want = {k: v.clone() for k, v in good.items()}
    # The last byte of the largest storage, at its place in the file (the mapping starts at 0).
    big = max((v.untyped_storage() for v in good.values()), key=lambda u: u.nbytes())
    (start, _), = ranges
    offset = big.data_ptr() - start + big.nbytes() - 1
    del good, big
    gc.collect()
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(zckpt.CorruptError, match=os.path.basename(path)):
        zckpt.load(path, mmap=True, weights_only=False)
    unchecked = zckpt.load(path, mmap=True, weights_only=False, verify=False)
    assert any(not torch.equal(unchecked[k], want[k]) for k in want)


_UNDER_64K_PAGES = r"""
import sys, torch, zckpt
from torch_family import assert_deep_equal
path, pt, flipped = sys.argv[1:4]
want = torch.load(pt, map_location="cpu", weights_only=False)
assert_deep_equal(zckpt.load(path, mmap=True, weights_only=False), want)
assert_deep_equal(zckpt.load(path, weights_only=False), want)
try:
    zckpt.load(flipped, mmap=True, weights_only=False)
    sys.exit("a flipped byte went unnoticed under 64 KiB pages")
except zckpt.CorruptError as e:
    assert "storage" in str(e), e
print("ok")
"""


def test_mmap_and_load_with_64k_pages(family, container):
    """The page arithmetic of a 64 KiB-page kernel (Grace's aarch64 kernels) on this one:
    ZCKPT_TEST_PAGE_SIZE, honoured by a build with tests (src/common/pages.h), set for a child
    process: mapped and read loads equal torch.load's, and a flipped byte is still refused."""
    path = container("module_state_dict.pt")
    flipped = container("dtypes.pt")
    big = max(ls_json(flipped)["storages"], key=lambda s: s["bytes"])
    with open(flipped, "r+b") as f:
        f.seek(big["offset"] + big["bytes"] - 1)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
    env = dict(os.environ, ZCKPT_TEST_PAGE_SIZE="65536")
    fixtures = os.path.join(os.path.dirname(__file__), "..", "fixtures")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [fixtures, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", _UNDER_64K_PAGES, path, family.pt("module_state_dict.pt"), flipped],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
