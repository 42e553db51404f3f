"""Commands that exited 0 with output that was wrong or missing now say so: convert of a folder
with nothing to convert, destinations whose extension names another format, a merged Hugging
Face folder that got a converted folder's weights container or no config, and zckpt.load of a
ShardedTensor file outside a process group blamed on the file."""
import os

import pytest
import torch

import zckpt
from zckpt_testing import run_cli


def test_convert_of_a_folder_with_nothing_to_convert_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_cli("convert", tmp_path / "empty", "-o", tmp_path / "out")
    assert r.returncode == 2 and "no checkpoint files to convert" in r.stderr, r.stdout + r.stderr
    (tmp_path / "only_config").mkdir()
    (tmp_path / "only_config" / "config.json").write_text("{}")
    r = run_cli("convert", tmp_path / "only_config", "-o", tmp_path / "out2")
    assert r.returncode == 2 and "only files it would copy" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "out2").exists()


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


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_sharded_tensor_file_outside_a_process_group_blames_the_environment(tmp_path):
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import init_from_local_shards, Shard, ShardMetadata
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        shard = Shard(torch.arange(4.0), ShardMetadata([0], [4], "rank:0/cpu"))
        torch.save({"w": init_from_local_shards([shard], [4])}, tmp_path / "m.pt")
    finally:
        dist.destroy_process_group()
    zckpt.convert(tmp_path / "m.pt", tmp_path / "m.zckpt")
    with pytest.raises(zckpt.ZckptError, match="init_process_group") as e:
        zckpt.load(tmp_path / "m.zckpt", weights_only=False)
    assert not isinstance(e.value, zckpt.CorruptError) and "intact" in str(e.value)
