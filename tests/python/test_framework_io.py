"""zckpt/_framework_io.py, which the framework integrations (zckpt.lightning, .transformers,
.accelerate) stand on, without any framework: torch.save / torch.load routed through zckpt
inside torch_io_through_zckpt, DCP's FileSystemWriter / FileSystemReader as zckpt.dcp's storage
inside dcp_io_through_zckpt, and torch's own functions and classes back after them. The frameworks themselves
are tests/frameworks (tools/ci/frameworks.sh)."""
import io
import os

import pytest
import torch

import zckpt
from zckpt import _framework_io as fio
from zckpt_testing import flip_byte, ls_json, run_cli


class NotData:
    """An object off zckpt's allowlist: zckpt.save refuses it."""

    def __init__(self, x):
        self.x = x


def state():
    torch.manual_seed(0)
    return {"w": torch.randn(8, 8), "b": torch.arange(5), "step": 3}


def test_inside_the_block_torch_save_writes_a_container_torch_load_reads(tmp_path):
    path = str(tmp_path / "optimizer.pt")
    saved = state()
    with fio.torch_io_through_zckpt():
        torch.save(saved, path)
        loaded = torch.load(path, weights_only=True)
    assert fio.is_container(path)
    assert run_cli("verify", path).returncode == 0
    assert loaded.keys() == saved.keys() and loaded["step"] == 3
    assert torch.equal(loaded["w"], saved["w"]) and torch.equal(loaded["b"], saved["b"])
    with pytest.raises(Exception):  # outside the block, torch.load is torch's own again
        torch.load(path, weights_only=True)


def test_torch_save_files_and_file_objects_stay_torchs(tmp_path):
    path = str(tmp_path / "old.pt")
    saved = state()
    torch.save(saved, path)  # a checkpoint from before zckpt was plugged in
    buf = io.BytesIO()
    with fio.torch_io_through_zckpt():
        loaded = torch.load(path, weights_only=True)
        torch.save(saved, buf)
    assert not fio.is_container(path) and torch.equal(loaded["w"], saved["w"])
    assert buf.getvalue()[:2] == b"PK"  # torch.save's zip, not a container
    assert torch.equal(torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["w"], saved["w"])


def test_an_object_zckpt_refuses_is_written_by_torch_save(tmp_path):
    path = str(tmp_path / "training_args.bin")
    with fio.torch_io_through_zckpt():
        torch.save(NotData(7), path)
    with open(path, "rb") as f:
        assert f.read(2) == b"PK"
    assert torch.load(path, weights_only=False).x == 7
    with pytest.raises(zckpt.UnsafeError):  # what the fallback stands on
        zckpt.save(NotData(7), str(tmp_path / "direct.zckpt"))


def test_torchs_functions_are_back_after_nested_blocks_and_errors():
    save, load = torch.save, torch.load
    with pytest.raises(RuntimeError, match="inner"):
        with fio.torch_io_through_zckpt():
            with fio.torch_io_through_zckpt():
                assert torch.save is not save and torch.load is not load
            assert torch.save is not save, "the inner block restored torch's functions too early"
            raise RuntimeError("inner")
    assert torch.save is save and torch.load is load


def test_a_flipped_byte_raises_corrupt_error_naming_file_and_chunk(tmp_path):
    path = str(tmp_path / "rng_state.pth")
    with fio.torch_io_through_zckpt():
        torch.save(state(), path)
    record = ls_json(path)["storages"][0]
    flip_byte(path, record["offset"] + record["bytes"] // 2)
    with fio.torch_io_through_zckpt(), pytest.raises(zckpt.CorruptError) as e:
        torch.load(path, weights_only=True)
    assert e.value.file == path and e.value.chunk is not None and "chunk" in str(e.value)


def test_wrap_methods_wraps_the_instance_once():
    class Saver:
        def save(self):
            return torch.save

    a, b = Saver(), Saver()
    original = torch.save
    fio.wrap_methods(a, ["save"])
    wrapped = a.save
    fio.wrap_methods(a, ["save"])
    assert a.save is wrapped, "a second wrap_methods wrapped again"
    assert a.save() is not original, "the wrapped method ran outside the block"
    assert b.save() is original and b.save.__func__ is Saver.save, "another instance changed"
    assert torch.save is original


def test_is_container_of_missing_and_foreign_files(tmp_path):
    assert not fio.is_container(str(tmp_path / "missing"))
    assert not fio.is_container(str(tmp_path))
    (tmp_path / "short").write_bytes(b"\x89ZC")
    assert not fio.is_container(str(tmp_path / "short"))


@pytest.mark.parametrize("module, framework", [("lightning", "lightning"), ("transformers", "transformers"),
                                               ("accelerate", "accelerate")])
def test_without_its_framework_an_integration_names_the_extra(module, framework):
    import importlib
    import importlib.util

    if importlib.util.find_spec(framework) is not None:
        pytest.skip(f"{framework} is installed here (tools/ci/frameworks.sh tests the integration with it)")
    with pytest.raises(ImportError, match=rf"pip install zckpt\[{module}\]"):
        integration = importlib.import_module(f"zckpt.{module}")
        integration.use_zckpt(object())


def test_the_format_constants_are_the_cores(tmp_path):
    """CONTAINER_MAGIC and the tensor flags come from the core (`_core.format_constants`), so a
    container's first bytes are the magic and a conj view's record carries the conj bit."""
    from zckpt import _core, _records

    path = tmp_path / "c.zckpt"
    zckpt.save({"z": torch.randn(4, dtype=torch.complex64).conj()}, path)
    assert path.read_bytes()[:len(fio.CONTAINER_MAGIC)] == fio.CONTAINER_MAGIC == b"\x89ZCK\r\n\x1a\n"
    assert fio.is_container(path)
    (rec,) = _records.of_path(str(path))
    assert rec.conj and not rec.neg and not rec.internal
    assert _core.format_constants()["tensor_flags"]["conj"] == 1 << 2


# ----- DCP's file-system storage inside dcp_io_through_zckpt (one process, no process group) -----

def dcp_state():
    torch.manual_seed(1)
    return {"w": torch.randn(64, 8), "b": torch.arange(6), "step": 7}


def assert_same_state(loaded, saved):
    assert loaded["step"] == saved["step"]
    assert torch.equal(loaded["w"], saved["w"]) and torch.equal(loaded["b"], saved["b"])


def dcp_round_trip(folder, saved):
    """Saves `saved` to `folder` and loads it into a state of zeros, both by DCP's FileSystemWriter /
    FileSystemReader called by name, as accelerate's FSDP functions call them; returns the load."""
    import torch.distributed.checkpoint as dist_cp

    dist_cp.save(saved, storage_writer=dist_cp.FileSystemWriter(folder))
    loaded = {"w": torch.zeros(64, 8), "b": torch.zeros(6, dtype=torch.int64), "step": 0}
    dist_cp.load(loaded, storage_reader=dist_cp.FileSystemReader(folder))
    return loaded


def test_inside_the_block_dcps_file_system_storage_is_zckpts(tmp_path):
    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

    import torch.distributed.checkpoint as dist_cp

    folder = str(tmp_path / "optimizer_0")
    saved = dcp_state()
    with fio.dcp_io_through_zckpt():
        assert isinstance(dist_cp.FileSystemWriter(folder), ZckptStorageWriter)
        assert not dist_cp.FileSystemWriter(path=folder, overwrite=False).overwrite
        loaded = dcp_round_trip(folder, saved)
        assert isinstance(dist_cp.FileSystemReader(folder), ZckptStorageReader)
    assert sorted(os.listdir(folder)) == [".metadata", "__0_0.zckpt"]
    assert run_cli("verify", folder).returncode == 0
    assert_same_state(loaded, saved)


def test_a_distcp_folder_and_other_options_stay_dcps(tmp_path):
    import torch.distributed.checkpoint as dist_cp

    folder = str(tmp_path / "pytorch_model_fsdp_0")
    saved = dcp_state()
    Writer, Reader = dist_cp.FileSystemWriter, dist_cp.FileSystemReader
    dist_cp.save(saved, storage_writer=Writer(folder))  # written before zckpt was plugged in
    with fio.dcp_io_through_zckpt():
        reader = dist_cp.FileSystemReader(folder)
        assert isinstance(reader, Reader) and type(reader) is not Reader
        assert isinstance(dist_cp.FileSystemWriter(str(tmp_path / "one"), single_file_per_rank=False), Writer)
        loaded = {"w": torch.zeros(64, 8), "b": torch.zeros(6, dtype=torch.int64), "step": 0}
        dist_cp.load(loaded, storage_reader=reader)
    assert_same_state(loaded, saved)
    assert any(n.endswith(".distcp") for n in os.listdir(folder))


def test_dcps_attributes_are_back_after_nested_blocks_and_errors():
    import torch.distributed.checkpoint as dist_cp

    before = dist_cp.FileSystemWriter, dist_cp.FileSystemReader, dist_cp.load
    save = torch.save
    with pytest.raises(RuntimeError, match="inner"):
        with fio.checkpoint_io_through_zckpt():
            with fio.dcp_io_through_zckpt():
                inside = dist_cp.FileSystemWriter
                assert inside is not before[0]
            assert dist_cp.FileSystemWriter is inside, "the inner block restored DCP's classes too early"
            raise RuntimeError("inner")
    assert (dist_cp.FileSystemWriter, dist_cp.FileSystemReader, dist_cp.load) == before
    assert torch.save is save


def test_a_flipped_byte_in_a_dcp_container_raises_corrupt_error(tmp_path):
    import torch.distributed.checkpoint as dist_cp

    folder = str(tmp_path / "optimizer_0")
    with fio.dcp_io_through_zckpt():
        dist_cp.save(dcp_state(), storage_writer=dist_cp.FileSystemWriter(folder))
    path = os.path.join(folder, "__0_0.zckpt")
    record = max(ls_json(path)["storages"], key=lambda s: s["bytes"])
    flip_byte(path, record["offset"] + record["bytes"] // 2)
    loaded = {"w": torch.zeros(64, 8), "b": torch.zeros(6, dtype=torch.int64), "step": 0}
    with fio.dcp_io_through_zckpt(), pytest.raises(zckpt.CorruptError) as e:
        dist_cp.load(loaded, storage_reader=dist_cp.FileSystemReader(folder))
    assert e.value.file == path and e.value.chunk is not None and "chunk" in str(e.value)
