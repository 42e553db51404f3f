"""zckpt.accelerate.use_zckpt under accelerate itself (tools/ci/frameworks.sh runs this in a
virtualenv with accelerate from PyPI, on the CPU). Each run is accelerate_worker.py in a process of
its own (torchrun for two ranks): a training loop that calls save_state after SAVE_AT steps and
stops, then a new process that calls load_state and goes on; the continuation must be
bit-identical to one uninterrupted run.

The test_fsdp_* tests drive accelerate's FSDP checkpoint component directly, because accelerate
does not run FSDP on the CPU: AcceleratorState.__init__ (accelerate/state.py, accelerate 1.16.0)
sets DistributedType.FSDP, and keeps the FSDP plugin, only for the accelerator types MULTI_GPU,
MULTI_MLU, MULTI_SDAA, MULTI_MUSA, MULTI_NPU, MULTI_XPU, MULTI_HPU, MULTI_NEURON; under torchrun on
the CPU the type is MULTI_CPU, the plugin is dropped, prepare() wraps the model in DDP and
save_state / load_state (and the Trainer, which builds the same Accelerator) never reach FSDP's
functions (docs/integrations.md, "FSDP under accelerate and the Trainer: not on the CPU"). So the
worker shards a model with FSDP2 (fully_shard on two gloo ranks) under a MULTI_CPU Accelerator and
calls accelerate.utils.fsdp_utils' save_fsdp_model / save_fsdp_optimizer / load_fsdp_model /
load_fsdp_optimizer itself, with SHARDED_STATE_DICT, inside zckpt.accelerate.fsdp_io(): the block
save_state and load_state run in under use_zckpt."""
import os
import shutil

import pytest

from frameworks_testing import (Worker, assert_containers, assert_stopped_by_corruption, flip_storage_byte, memoized,
                                run_cli)

pytest.importorskip("accelerate")

SAVE_AT = 6  # accelerate_worker.SAVE_AT


WORKER = Worker("accelerate_worker.py")
run, train = WORKER.run, WORKER.ok


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """ranks -> the uninterrupted run (made on first use)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return memoized(lambda ranks: train(tmp, f"full{ranks}", ranks, io="default"))


def state_files(folder, ranks=1):
    """What save_state writes, all with torch.save under use_zckpt: the model (pytorch_model.bin),
    optimizer, scheduler, one RNG file per rank and the registered Progress object."""
    names = ["pytorch_model.bin", "optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"]
    names += [f"random_states_{r}.pkl" for r in range(ranks)]
    return [os.path.join(folder, n) for n in names]


def interrupt_and_resume(tmp_path, first_io, resume_io, ranks=1):
    folder = str(tmp_path / "state")
    first = train(tmp_path, "first", ranks, io=first_io, save_dir=folder)
    resumed = train(tmp_path, "resumed", ranks, io=resume_io, resume=folder)
    return first, resumed, folder


def assert_bit_identical(full, first, resumed):
    assert first["losses"] == full["losses"][:SAVE_AT]
    assert resumed["losses"] == full["losses"][SAVE_AT:], "the continuation's losses differ"
    assert resumed["params"] == full["params"], "the continuation's parameters differ"
    assert resumed["global_step"] == full["global_step"]


def test_state_files_are_containers_and_resume_is_bit_identical(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "zckpt", "zckpt")
    assert_bit_identical(uninterrupted(), first, resumed)
    written = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    assert written == sorted(state_files(folder))
    assert_containers(written)


def test_state_of_accelerates_default_io_loads(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "default", "zckpt")
    assert os.path.exists(os.path.join(folder, "model.safetensors")), os.listdir(folder)
    with open(os.path.join(folder, "optimizer.bin"), "rb") as f:
        assert f.read(2) == b"PK", "accelerate's default I/O writes torch.save's zip"
    assert_bit_identical(uninterrupted(), first, resumed)


@pytest.mark.parametrize("damaged", ["pytorch_model.bin", "optimizer.bin"])
def test_flipped_byte_stops_the_load(tmp_path, damaged):
    folder = str(tmp_path / "state")
    train(tmp_path, "first", io="zckpt", save_dir=folder)
    path = os.path.join(folder, damaged)
    flip_storage_byte(path)
    assert_stopped_by_corruption(lambda: run(tmp_path, "resumed", io="zckpt", resume=folder), path, folder)


def test_torchrun_two_ranks(tmp_path, uninterrupted):
    first, resumed, folder = interrupt_and_resume(tmp_path, "zckpt", "zckpt", ranks=2)
    assert_bit_identical(uninterrupted(2), first, resumed)
    assert_containers(state_files(folder, ranks=2))


FSDP_SAVE_AT = 4  # accelerate_worker.FSDP_SAVE_AT
# What save_fsdp_model and save_fsdp_optimizer write under the folder they are given, with
# SHARDED_STATE_DICT: one DCP folder each.
FSDP_FOLDERS = ("pytorch_model_fsdp_0", "optimizer_0")


@pytest.fixture(scope="module")
def fsdp_full(tmp_path_factory):
    """(the uninterrupted FSDP2 run, its two saves at FSDP_SAVE_AT: {"zckpt": folder, "default":
    folder}). Saving does not change the run's course: the resumed runs are compared with it."""
    tmp = tmp_path_factory.mktemp("fsdp")
    saved = {io: str(tmp / io) for io in ("zckpt", "default")}
    full = train(tmp, "full", 2, fsdp=2, saves=[[io, folder] for io, folder in saved.items()])
    return full, saved


def resume_fsdp(tmp_path, full, folder):
    resumed = train(tmp_path, "resumed", 2, fsdp=2, resume=["zckpt", folder])
    assert resumed["losses"] == full["losses"][FSDP_SAVE_AT:], "the continuation's losses differ"
    assert resumed["params"] == full["params"], "the continuation's parameters differ"


def test_fsdp_sharded_state_is_containers_and_resume_is_bit_identical(tmp_path, fsdp_full):
    full, saved = fsdp_full
    for name in FSDP_FOLDERS:
        folder = os.path.join(saved["zckpt"], name)
        assert sorted(os.listdir(folder)) == [".metadata", "__0_0.zckpt", "__1_0.zckpt"], os.listdir(folder)
        assert_containers([os.path.join(folder, n) for n in ("__0_0.zckpt", "__1_0.zckpt")])
        r = run_cli("verify", folder)
        assert r.returncode == 0, f"zckpt verify {folder}: {r.stdout}{r.stderr}"
    resume_fsdp(tmp_path, full, saved["zckpt"])


def test_fsdp_sharded_state_of_dcps_default_io_loads(tmp_path, fsdp_full):
    full, saved = fsdp_full
    for name in FSDP_FOLDERS:
        written = os.listdir(os.path.join(saved["default"], name))
        assert any(n.endswith(".distcp") for n in written) and not any(n.endswith(".zckpt") for n in written)
    resume_fsdp(tmp_path, full, saved["default"])


@pytest.mark.parametrize("damaged", ["pytorch_model_fsdp_0/__1_0.zckpt", "optimizer_0/__0_0.zckpt"])
def test_fsdp_flipped_byte_stops_the_load(tmp_path, fsdp_full, damaged):
    folder = str(tmp_path / "state")
    shutil.copytree(fsdp_full[1]["zckpt"], folder)
    path = os.path.join(folder, damaged)
    flip_storage_byte(path)
    assert_stopped_by_corruption(lambda: run(tmp_path, "resumed", 2, fsdp=2, resume=["zckpt", folder]), path,
                                 folder, exit_code=1)
