"""`zckpt.deepspeed.use_zckpt(engine)` with DeepSpeed 0.19.8 itself (deepspeed.initialize's engine,
its save_checkpoint and load_checkpoint, unedited) on DeepSpeed's CPU accelerator, two gloo ranks
(deepspeed_worker.py): ZeRO stage 0, 1, 2 and 3 in fp32 and ZeRO 2 in bf16, torch's AdamW. The save
writes a container for every file DeepSpeed's checkpoint engine is handed and no .pt; a resume in
new processes through load_checkpoint continues bit for bit like the uninterrupted run, from the
zckpt save and from a save made with DeepSpeed's default engine; a flipped byte makes the load
raise CorruptError naming the file and the chunk.

Run with a Python that has deepspeed (its cached virtualenv, ~/.cache/zckpt/frameworks/deepspeed)."""
import os
import shutil
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import zckpt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deepspeed_worker as worker  # noqa: E402
import gloo_ranks  # noqa: E402

WORLD_SIZE = 2  # ZeRO 1, 2 and 3 partition the optimizer over the ranks: one file each
# Seconds a phase may take (a 2-core VM shared with builds takes ~30 s; the first run on a
# machine also builds DeepSpeed's CPU communication extension, ~3 minutes).
PHASE_TIMEOUT_S = 900
# The files DeepSpeed writes itself, not through its checkpoint engine.
DEEPSPEED_OWN = {"latest", "zero_to_fp32.py", "zero_to_torch.py"}


def _spawn(phase, root, *extra):
    return gloo_ranks.spawn(os.path.join(HERE, "deepspeed_worker.py"), WORLD_SIZE, phase, root, *extra,
                            env=dict(os.environ, DS_ACCELERATOR="cpu"), timeout=PHASE_TIMEOUT_S)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("deepspeed"))
    _spawn("save", root)
    return root


@pytest.mark.parametrize("config", worker.CONFIGS)
def test_deepspeed_save_writes_a_container_for_each_file_and_each_verifies(saved, config):
    folder = os.path.join(worker.ckpt_dir(saved, config, "z"), worker.TAG)
    names = sorted(os.listdir(folder))
    default = sorted(os.listdir(os.path.join(worker.ckpt_dir(saved, config, "pt"), worker.TAG)))
    # One container for each file DeepSpeed's default engine writes, under its name, .pt -> .zckpt.
    assert names == sorted(n[:-len(".pt")] + ".zckpt" for n in default), (names, default)
    stage, bf16 = worker.CONFIGS[config]
    optim = ("bf16_" if bf16 else "") + "zero_pp_rank_{}_mp_rank_00_optim_states.zckpt"
    if stage == 3:  # the module is partitioned too: each rank writes its part
        want = {f"zero_pp_rank_{r}_mp_rank_00_model_states.zckpt" for r in range(WORLD_SIZE)}
    else:
        want = {"mp_rank_00_model_states.zckpt"}
    want |= {optim.format(r) for r in range(WORLD_SIZE)} if stage else set()
    assert set(names) == want, names
    for name in names:
        assert zckpt.verify(os.path.join(folder, name)) is not None
    top = set(os.listdir(worker.ckpt_dir(saved, config, "z"))) - {worker.TAG}
    assert top <= DEEPSPEED_OWN, top  # nothing else of DeepSpeed's went around the engine


def test_deepspeed_resume_continues_bit_for_bit_from_zckpt_and_default_saves(saved):
    results = _spawn("resume", saved)
    for r, res in results.items():
        assert len(res) == len(worker.CONFIGS) * 2 * 4, sorted(res)
        bad = {k: v for k, v in res.items() if v is not None}
        assert not bad, (r, bad)


@pytest.mark.parametrize("config", ["zero0", "zero2"])
def test_deepspeed_load_of_a_flipped_byte_raises_corrupt_error_naming_file_and_chunk(saved, config):
    bad = worker.ckpt_dir(saved, config, "bad")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(worker.ckpt_dir(saved, config, "z"), bad)
    # Stage 0: the one model file every rank reads; stage 2: rank BAD_RANK's optimizer partition.
    victim = "mp_rank_00_model_states.zckpt" if worker.CONFIGS[config][0] == 0 else \
        f"zero_pp_rank_{worker.BAD_RANK}_mp_rank_00_optim_states.zckpt"
    gloo_ranks.flip_chunk_byte(os.path.join(bad, worker.TAG, victim))
    results = _spawn("corrupt", saved, config)
    readers = range(WORLD_SIZE) if worker.CONFIGS[config][0] == 0 else [worker.BAD_RANK]
    for r in readers:
        got = results[r]["raised"]
        assert got is not None, f"rank {r}: the load went on"
        assert got["class"] == "CorruptError", got
        assert victim in got["message"] and "chunk" in got["message"], got
    for r in set(range(WORLD_SIZE)) - set(readers):
        # DeepSpeed's ZeRO 2 load runs no collective: a rank whose own files are intact returns
        # (the job stops when the launcher sees the damaged rank exit).
        assert results[r]["raised"] is None, results[r]


def test_engine_save_replaces_the_pt_and_load_reads_the_newer_file_or_a_container_by_its_magic(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    import zckpt.deepspeed as zds

    engine = zds.ZckptCheckpointEngine()
    weights = torch.arange(12, dtype=torch.float32)
    state = {"w": weights, "view": weights[4:8], "loss_scaler": LossScaler(128.0),
             "zero_stage": ZeroStageEnum.gradients, "fragments": [fragment_address(numel=4, start=8)]}
    pt = str(tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    torch.save({"old": torch.zeros(2)}, pt)
    engine.save(state, pt)
    container = str(tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.zckpt")
    assert not os.path.exists(pt) and zckpt.verify(container) is not None
    got = engine.load(pt, map_location="cpu")
    assert torch.equal(got["w"], weights) and got["view"].data_ptr() == got["w"].data_ptr() + 16
    assert type(got["loss_scaler"]) is LossScaler and vars(got["loss_scaler"]) == vars(state["loss_scaler"])
    assert got["zero_stage"] is ZeroStageEnum.gradients and got["fragments"] == state["fragments"]
    # Without the engine the container holds DeepSpeed's objects as data, no global of theirs.
    plain = zckpt.load(container, weights_only=True)
    assert plain["loss_scaler"][zds.OBJECT_KEY] == "deepspeed.runtime.fp16.loss_scaler:LossScaler"
    # A .pt written after the container (DeepSpeed's default engine, later) is the one read.
    os.utime(container, (1, 1))
    torch.save({"newer": torch.ones(3)}, pt)
    assert sorted(engine.load(pt)) == ["newer"]
    # A container under a .pt name is read by its magic.
    os.remove(container)
    zckpt.save({"renamed": torch.ones(2)}, pt)
    assert sorted(engine.load(pt)) == ["renamed"]
    # A data form naming a class outside DeepSpeed is refused, nothing imported.
    zckpt.save({"x": {zds.OBJECT_KEY: "os:system", "state": {}}}, container)
    with pytest.raises(zckpt.ZckptError, match="os:system"):
        engine.load(container)
