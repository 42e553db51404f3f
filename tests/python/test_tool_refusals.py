"""Commands that exited 0 with output that was wrong or missing now say so: convert of a folder
with nothing to convert, destinations whose extension names another format, a merged Hugging
Face folder that got a converted folder's weights container or no config, and zckpt.load of a
ShardedTensor file outside a process group blamed on the file."""
import os

import pytest
import torch

import zckpt
from zckpt_testing import run_cli


def test_convert_of_an_empty_folder_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_cli("convert", tmp_path / "empty", "-o", tmp_path / "out")
    assert r.returncode == 2 and "an empty folder" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


def test_destinations_named_as_another_format_are_refused(tmp_path):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "x.pt")
    r = run_cli("convert", tmp_path / "x.pt", "-o", tmp_path / "y.pt")
    assert r.returncode == 2 and "y.pt names a .pt file" in r.stderr, r.stderr
    assert not (tmp_path / "y.pt").exists()
    assert run_cli("convert", tmp_path / "x.pt", "-o", tmp_path / "y.zckpt").returncode == 0
    r = run_cli("export", tmp_path / "y.zckpt", "-o", tmp_path / "y.npz")
    assert r.returncode == 2 and ".npz" in r.stderr and "torch.save" in r.stderr, r.stderr
    assert not (tmp_path / "y.npz").exists()
    for name in ("y.bin", "y.pth", "y.safetensors"):  # torch's own names, and safetensors by its extension
        assert run_cli("export", tmp_path / "y.zckpt", "-o", tmp_path / name).returncode == 0, name
    assert torch.equal(torch.load(tmp_path / "y.bin")["w"], torch.arange(4.0))


def test_merge_copies_config_not_a_converted_weights_container(tmp_path):
    from safetensors.torch import save_file

    verl = tmp_path / "verl"
    (verl / "huggingface").mkdir(parents=True)
    for r in range(2):
        torch.save({"w": torch.arange(6.0), "b": torch.ones(2)}, verl / f"model_world_size_2_rank_{r}.pt")
    (verl / "huggingface" / "config.json").write_text('{"model_type": "toy"}')
    save_file({"w": torch.zeros(6)}, str(verl / "huggingface" / "model.safetensors"))
    assert run_cli("convert", verl, "-o", tmp_path / "z").returncode == 0
    assert (tmp_path / "z" / "huggingface" / "model.zckpt").exists()
    r = run_cli("merge", tmp_path / "z", "-o", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors"]


def test_merge_of_a_dcp_folder_takes_a_config_folder(tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.arange(8.0)}}, checkpoint_id=str(tmp_path / "dcp"))
    r = run_cli("merge", tmp_path / "dcp", "-o", tmp_path / "hf", "--keys", "model.")
    assert r.returncode == 0 and "no config.json" in r.stdout and "--hf-config" in r.stdout, r.stdout + r.stderr
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text('{"model_type": "toy"}')
    (tmp_path / "cfg" / "model.safetensors").write_bytes(b"not copied")
    r = run_cli("merge", tmp_path / "dcp", "-o", tmp_path / "hf2", "--keys", "model.", "--hf-config", tmp_path / "cfg")
    assert r.returncode == 0 and "no config.json" not in r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path / "hf2")) == ["config.json", "model.safetensors"]
    assert (tmp_path / "hf2" / "config.json").read_text() == '{"model_type": "toy"}'
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "hf2" / "model.safetensors"))["w"], torch.arange(8.0))


_SHARDED_FILE = """
import sys, torch, torch.distributed as dist
from torch.distributed._shard.sharded_tensor import init_from_local_shards, Shard, ShardMetadata
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
shard = Shard(torch.arange(4.0), ShardMetadata([0], [4], "rank:0/cpu"))
torch.save({"w": init_from_local_shards([shard], [4])}, sys.argv[1])
"""

_LOAD_IT = """
import sys, zckpt
try:
    zckpt.load(sys.argv[1], weights_only=False)
    print("loaded")
except zckpt.ZckptError as e:
    print(type(e).__name__, isinstance(e, zckpt.CorruptError), e)
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_sharded_tensor_file_outside_a_process_group_blames_the_environment(tmp_path):
    import subprocess
    import sys

    # Fresh processes: one saves inside a (fake) group, the other loads outside any.
    subprocess.run([sys.executable, "-c", _SHARDED_FILE, str(tmp_path / "m.pt")], check=True, timeout=120)
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    r = subprocess.run([sys.executable, "-c", _LOAD_IT, str(tmp_path / "m.zckpt")], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.startswith("ZckptError False "), r.stdout + r.stderr
    assert "intact" in r.stdout and "init_process_group" in r.stdout and "m.zckpt" in r.stdout, r.stdout


def test_dcp_load_refuses_chunks_that_neither_tile_nor_replicate(tmp_path):
    # A DCP .metadata whose chunks leave a gap, or overlap without being the same box: DCP's
    # planner would leave the gap's destination as it was, or whichever chunk it read last.
    import dataclasses
    import pickle

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter, load_metadata

    dcp.save({"w": torch.arange(8.0)}, storage_writer=ZckptStorageWriter(str(tmp_path / "ck")))
    meta_path = tmp_path / "ck" / ".metadata"
    original = meta_path.read_bytes()
    target = {"w": torch.zeros(8)}
    dcp.load(target, storage_reader=ZckptStorageReader(str(tmp_path / "ck")))
    assert torch.equal(target["w"], torch.arange(8.0))  # the untouched folder loads
    for chunks, why in (([ChunkStorageMetadata(torch.Size([0]), torch.Size([6]))], "cover 6 of its 8"),
                        ([ChunkStorageMetadata(torch.Size([0]), torch.Size([8])),
                          ChunkStorageMetadata(torch.Size([2]), torch.Size([6]))], "overlap")):
        md = load_metadata(str(meta_path))
        md.state_dict_metadata["w"] = dataclasses.replace(md.state_dict_metadata["w"], chunks=chunks)
        meta_path.write_bytes(pickle.dumps(md))
        target = {"w": torch.full((8,), -1.0)}
        # DCP carries the reader's CorruptError inside its CheckpointException.
        with pytest.raises((zckpt.CorruptError, CheckpointException)) as e:
            dcp.load(target, storage_reader=ZckptStorageReader(str(tmp_path / "ck")))
        assert why in str(e.value) and "tensor 'w'" in str(e.value) and ".metadata" in str(e.value), str(e.value)
        assert torch.equal(target["w"], torch.full((8,), -1.0))
        meta_path.write_bytes(original)


def test_dcp_export_refuses_a_folder_whose_chunks_do_not_tile(tmp_path):
    import dataclasses
    import pickle

    import torch.distributed.checkpoint as dcp
    from zckpt.dcp import load_metadata

    dcp.save({"w": torch.arange(8.0)}, checkpoint_id=str(tmp_path / "fs"))
    assert run_cli("convert", tmp_path / "fs", "-o", tmp_path / "z").returncode == 0
    assert run_cli("export", tmp_path / "z", "-o", tmp_path / "ok").returncode == 0
    md = load_metadata(str(tmp_path / "z" / ".metadata"))
    # The one chunk, as saved, of a tensor the metadata now says has 10 elements: a gap.
    md.state_dict_metadata["w"] = dataclasses.replace(md.state_dict_metadata["w"], size=torch.Size([10]))
    (tmp_path / "z" / ".metadata").write_bytes(pickle.dumps(md))
    r = run_cli("export", tmp_path / "z", "-o", tmp_path / "back")
    assert r.returncode == 1 and "'w'" in r.stderr and "cover 8 of its 10" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "back").exists() or not os.listdir(tmp_path / "back")
