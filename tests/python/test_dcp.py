"""zckpt under torch.distributed.checkpoint, `zckpt merge`, `zckpt reshard`, and DCP folders in
`zckpt convert/export/verify`.

One spawned group of 4 gloo ranks (dcp_workers.py) saves FSDP2 + AdamW at 4, 2 and 1 ranks and
FSDP1 at 4, through ZckptStorageWriter and DCP's FileSystemWriter, and loads every save at 1, 2
and 3 ranks through ZckptStorageReader and FileSystemReader: every parameter and optimizer
moment must be equal (asserted in the ranks). The tests below check what the ranks recorded and
run the torch-free tools over the folders they wrote, against the full state dicts torch itself
gathered (DTensor.full_tensor, FSDP1's FULL_STATE_DICT)."""
import glob
import io
import json
import os
import pickle
import shutil
import socket

import pytest
import torch

import zckpt
import zckpt.dcp
import zckpt_testing
from zckpt_testing import run_cli

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo unavailable")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """The folders the spawned ranks wrote, and what they recorded."""
    import torch.multiprocessing as mp

    import dcp_workers

    root = str(tmp_path_factory.mktemp("dcp"))
    mp.spawn(dcp_workers.worker, args=(root, _free_port()), nprocs=4, join=True)
    results = [json.load(open(f"{root}/results_rank{r}.json")) for r in range(4)]
    return root, results


def _safetensors(folder):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(glob.glob(f"{folder}/*.safetensors")):
        out.update(load_file(f))
    return out


def _assert_bit_equal(got, ref):
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        assert torch.equal(got[k].view(torch.uint8), ref[k].contiguous().view(torch.uint8)), k


def test_every_save_loads_at_every_world_size_like_dcp_itself(group):
    root, results = group
    compared = {tuple(c[:3]) for c in results[0]["compared"]}
    assert compared == {(k, s, n) for k, sizes in (("fsdp2", (4, 2, 1)), ("fsdp1", (4,))) for s in sizes
                        for n in (1, 2, 3)}


def test_a_rank_reads_only_the_chunks_its_pieces_touch(group):
    root, results = group
    reads = [r for res in results for r in res["reads"] if r["kind"] == "fsdp2" and r["saved"] == 4]
    assert reads
    for r in reads:
        # Whole 4 KiB chunks are read and checked: at most a chunk of slack at each end of each box.
        assert r["needed"] <= r["read"] <= r["needed"] + 2 * 4096 * r["regions"], r
    total = sum(os.path.getsize(f) for f in glob.glob(f"{root}/fsdp2_s4/zckpt/*.zckpt"))
    at2 = [r for r in reads if r["loaded"] == 2]
    assert len(at2) == 2 and all(r["read"] < 0.7 * total for r in at2)


def test_a_corrupt_chunk_fails_the_load_naming_file_and_range(group):
    root, _ = group
    for rank in (0, 1):
        msg = open(f"{root}/corrupt_rank{rank}.txt").read()
        assert "CorruptError" in msg or "corrupt" in msg.lower(), msg
        assert "__1_0.zckpt" in msg and "file bytes [" in msg and "model.0.weight@64,0" in msg, msg
    r = run_cli("verify", f"{root}/corrupt")
    assert r.returncode == 1 and "__1_0.zckpt" in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1"])
def test_merge_verl_shards_equals_torch_full_state_dict(group, tmp_path, kind):
    root, _ = group
    ref = torch.load(f"{root}/full_{kind}.pt", weights_only=True)
    verl = f"{root}/verl_{kind}"
    # The .pt files themselves, and their conversion; a Hugging Face folder and a container.
    r = run_cli("merge", verl, "-o", tmp_path / "hf_pt")
    assert r.returncode == 0, r.stderr
    _assert_bit_equal(_safetensors(tmp_path / "hf_pt"), ref)
    assert json.load(open(tmp_path / "hf_pt" / "config.json")) == {"model_type": "toy"}
    assert run_cli("convert", verl, "-o", tmp_path / "z").returncode == 0
    r = run_cli("merge", tmp_path / "z", "-o", tmp_path / "hf", "--max-shard-size", "20000")
    assert r.returncode == 0, r.stderr
    index = json.load(open(tmp_path / "hf" / "model.safetensors.index.json"))
    assert sorted(index["weight_map"]) == sorted(ref) and len(set(index["weight_map"].values())) > 1
    _assert_bit_equal(_safetensors(tmp_path / "hf"), ref)
    assert run_cli("merge", tmp_path / "z", "-o", tmp_path / "m.zckpt").returncode == 0
    _assert_bit_equal(zckpt.load(tmp_path / "m.zckpt"), ref)
    assert run_cli("export", tmp_path / "m.zckpt", "-o", tmp_path / "m.pt").returncode == 0
    _assert_bit_equal(torch.load(tmp_path / "m.pt", weights_only=True), ref)


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1"])
def test_merge_dcp_folders_of_both_layouts(group, tmp_path, kind):
    root, _ = group
    ref = torch.load(f"{root}/full_{kind}.pt", weights_only=True)
    base = f"{root}/{kind}_s4"
    # zckpt's writer, FileSystemWriter's own layout, and that layout converted.
    assert run_cli("convert", f"{base}/fs", "-o", tmp_path / "conv").returncode == 0
    for i, folder in enumerate([f"{base}/zckpt", f"{base}/fs", tmp_path / "conv"]):
        r = run_cli("merge", folder, "-o", tmp_path / f"hf{i}", "--keys", "model.")
        assert r.returncode == 0, r.stderr
        _assert_bit_equal(_safetensors(tmp_path / f"hf{i}"), ref)


def test_convert_verify_export_of_a_filesystemwriter_folder(group, tmp_path):
    root, _ = group
    fs = f"{root}/fsdp2_s4/fs"
    r = run_cli("convert", fs, "-o", tmp_path / "z")
    assert r.returncode == 0 and "4 .distcp files" in r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path / "z")) == [".metadata"] + [f"__{i}_0.zckpt" for i in range(4)]
    r = run_cli("verify", tmp_path / "z")
    assert r.returncode == 0 and "4 containers verified" in r.stdout, r.stdout + r.stderr
    r = run_cli("verify", fs)  # the original: structure checked, no checksums to check
    assert r.returncode == 0 and "no checksums" in r.stdout, r.stdout
    assert run_cli("export", tmp_path / "z", "-o", tmp_path / "back").returncode == 0
    for name in os.listdir(fs):
        assert zckpt_testing.sha256(f"{fs}/{name}") == zckpt_testing.sha256(tmp_path / "back" / name), name
    # A folder written by ZckptStorageWriter has no .distcp bytes to give back.
    r = run_cli("export", f"{root}/fsdp2_s4/zckpt", "-o", tmp_path / "no")
    assert r.returncode == 2 and "ZckptStorageWriter" in r.stderr
    # A flipped byte in a converted container: verify names it and exits 1.
    shutil.copytree(tmp_path / "z", tmp_path / "bad")
    storage = zckpt_testing.storage_of(tmp_path / "bad" / "__2_0.zckpt", "model.0.weight@128,0")
    zckpt_testing.flip_byte(tmp_path / "bad" / "__2_0.zckpt", storage["offset"])
    r = run_cli("verify", tmp_path / "bad")
    assert r.returncode == 1 and "__2_0.zckpt" in r.stderr and "model.0.weight@128,0" in r.stderr


def test_reshard_verl_fsdp2_equals_what_torch_saves_at_that_world_size(group, tmp_path):
    from zckpt import _C  # the C++ object tree (load_tree); zckpt.dcp and reshard do not import it

    root, _ = group
    # Through the tool (it runs python -m zckpt reshard, which wants a process of its own).
    r = run_cli("reshard", f"{root}/verl_fsdp2", "--world-size", "3", "-o", tmp_path / "r3")
    assert r.returncode == 0, r.stderr
    assert json.load(open(tmp_path / "r3" / "huggingface" / "config.json")) == {"model_type": "toy"}
    # Rank by rank, the same local shards and placement metadata as the model loaded at 3 ranks
    # saved itself (read torch-free: zckpt's object tree holds a DTensor's local tensor).
    assert run_cli("convert", f"{root}/verl_fsdp2_at3", "-o", tmp_path / "want").returncode == 0
    for r in range(3):
        name = f"model_world_size_3_rank_{r}.zckpt"
        got, want = _C.load_tree(str(tmp_path / "r3" / name)), _C.load_tree(str(tmp_path / "want" / name))
        assert list(got) == list(want) and len(want) == 5
        for k in want:
            assert torch.equal(got[k], want[k]), (r, k)
        meta = {t["name"]: t.get("extra") for t in zckpt_testing.ls_json(tmp_path / "r3" / name)["tensors"]}
        meta_want = {t["name"]: t.get("extra") for t in zckpt_testing.ls_json(tmp_path / "want" / name)["tensors"]}
        for k in want:
            for field in ("global_shape", "placements", "mesh_shape"):
                assert meta[k][field] == meta_want[k][field], (r, k, field)
    # And merging the resharded files gives the full model back.
    assert run_cli("merge", tmp_path / "r3", "-o", tmp_path / "hf").returncode == 0
    _assert_bit_equal(_safetensors(tmp_path / "hf"), torch.load(f"{root}/full_fsdp2.pt", weights_only=True))


def test_reshard_verl_fsdp1_round_trips_through_merge(group, tmp_path):
    root, _ = group
    r = run_cli("reshard", f"{root}/verl_fsdp1", "--world-size", "3", "-o", tmp_path / "r3", "--format", "pt")
    assert r.returncode == 0, r.stderr
    assert sorted(f for f in os.listdir(tmp_path / "r3") if f.startswith("model_")) == [
        f"model_world_size_3_rank_{i}.pt" for i in range(3)]
    assert run_cli("merge", tmp_path / "r3", "-o", tmp_path / "hf").returncode == 0
    _assert_bit_equal(_safetensors(tmp_path / "hf"), torch.load(f"{root}/full_fsdp1.pt", weights_only=True))
    # Outputs that exist are refused before anything is written, unless --force.
    rank0 = tmp_path / "r3" / "model_world_size_3_rank_0.pt"
    rank0.write_bytes(b"precious")
    r = run_cli("reshard", f"{root}/verl_fsdp1", "--world-size", "3", "-o", tmp_path / "r3", "--format", "pt")
    assert r.returncode == 2 and "exist" in r.stderr and "--force" in r.stderr, r.stderr
    assert rank0.read_bytes() == b"precious"
    r = run_cli("reshard", f"{root}/verl_fsdp1", "--world-size", "3", "-o", tmp_path / "r3", "--format", "pt", "--force")
    assert r.returncode == 0, r.stderr
    assert rank0.read_bytes() != b"precious"


def test_merge_refuses_shards_that_do_not_tile(group, tmp_path):
    root, _ = group
    shutil.copytree(f"{root}/verl_fsdp2", tmp_path / "v")
    os.unlink(tmp_path / "v" / "model_world_size_4_rank_2.pt")
    r = run_cli("merge", tmp_path / "v", "-o", tmp_path / "out")
    assert r.returncode == 2 and "rank 2 of 4 is missing" in r.stderr
    # A rank's file standing in for another (DTensors do not record their rank; the file does).
    shutil.copyfile(tmp_path / "v" / "model_world_size_4_rank_1.pt", tmp_path / "v" / "model_world_size_4_rank_2.pt")
    r = run_cli("merge", tmp_path / "v", "-o", tmp_path / "out")
    assert r.returncode == 1 and "saved as model_world_size_4_rank_1" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


class _Runs:
    """Unpickling this writes a file: proof that something ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_metadata_and_bytes_items_are_vetted_before_python_unpickles_them(group, tmp_path):
    root, _ = group
    marker = tmp_path / "ran"
    folder = tmp_path / "hostile"
    shutil.copytree(f"{root}/fsdp2_s4/zckpt", folder)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(_Runs(marker), f)
    with pytest.raises(zckpt.UnsafeError, match="posix.system|os.system"):
        zckpt.dcp.load_metadata(folder)
    r = run_cli("verify", folder)
    assert r.returncode == 1 and "refused global" in r.stderr
    # A BytesIO item that would run code when DCP's planner torch.loads it.
    import torch.distributed.checkpoint as dcp

    evil = tmp_path / "evil"
    dcp.save({"x": torch.ones(2), "obj": _Runs(marker)}, storage_writer=zckpt.dcp.ZckptStorageWriter(evil), no_dist=True)
    from torch.distributed.checkpoint.api import CheckpointException

    state = {"x": torch.zeros(2), "obj": None}
    with pytest.raises(CheckpointException, match="refused global"):
        dcp.load(state, storage_reader=zckpt.dcp.ZckptStorageReader(evil), no_dist=True)
    assert not marker.exists()


def test_metadata_with_memory_format_members_as_older_torch_pickles_them(group, tmp_path):
    """torch 2.4-2.9 pickle TensorProperties' memory format as (getattr, (_MEM_FORMAT_ENCODING,
    'TORCH_CONTIGUOUS_FORMAT')): read back, while that getattr reaches no other attribute of
    anything (tools/ci/torch-matrix.sh saves and loads through zckpt.dcp under those torches)."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

    root, _ = group
    folder = tmp_path / "old"
    shutil.copytree(f"{root}/fsdp2_s4/zckpt", folder)
    meta = zckpt.dcp.load_metadata(folder)

    class _OldPickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, _MEM_FORMAT_ENCODING):
                return getattr, (_MEM_FORMAT_ENCODING, obj.name)
            return NotImplemented

    buf = io.BytesIO()
    _OldPickler(buf).dump(meta)
    assert b"getattr" in buf.getvalue()
    (folder / ".metadata").write_bytes(buf.getvalue())
    back = zckpt.dcp.load_metadata(folder)
    assert isinstance(back, Metadata)
    props = [i.properties for i in back.state_dict_metadata.values() if hasattr(i, "properties")]
    assert props and all(p.memory_format == torch.contiguous_format for p in props)
    assert back.state_dict_metadata.keys() == meta.state_dict_metadata.keys()
    for cls, name in ((_MEM_FORMAT_ENCODING, "__class__"), (Metadata, "__init__"), (_MEM_FORMAT_ENCODING, 3)):
        with pytest.raises(pickle.UnpicklingError, match="not a member of DCP's memory-format enum"):
            zckpt.dcp._enum_member(cls, name)


def test_cuda_state_dict_saves_and_loads_in_place_on_the_device(tmp_path, needs_cuda):
    """A GPU rank's DCP save and resume: tensors on the device are copied out in pieces
    (ZckptStorageWriter), and loaded into the state dict's own CUDA tensors through host staging
    and copy_ (ZckptStorageReader, zckpt/_regions.py): the same device memory, the same bytes."""
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(5)
    cpu = {"w": torch.randn(1024, 3000, generator=g),  # 12 MiB: several chunks, more than one ring slot
           "h": torch.randn(64, 48, generator=g).to(torch.bfloat16),
           "t": torch.randn(300, 200, generator=g).t(),  # a transposed view: saved contiguous, loaded staged
           "step": torch.tensor(7)}
    state = {k: v.cuda() for k, v in cpu.items()}
    folder = tmp_path / "ckpt"
    dcp.save(state, storage_writer=zckpt.dcp.ZckptStorageWriter(folder, chunk_bytes=1 << 20), no_dist=True)
    back = {k: torch.zeros_like(v) for k, v in state.items()}  # "t": a column-major target
    assert not back["t"].is_contiguous()
    ptrs = {k: v.data_ptr() for k, v in back.items()}
    reader = zckpt.dcp.ZckptStorageReader(folder)
    dcp.load(back, storage_reader=reader, no_dist=True)
    assert reader.last_read["regions"] == len(cpu)
    for k, ref in cpu.items():
        assert back[k].is_cuda and back[k].data_ptr() == ptrs[k], k
        assert torch.equal(back[k].cpu(), ref), k
