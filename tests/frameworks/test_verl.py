"""`zckpt.verl.use_zckpt()` with verl 0.9.1 itself (its FSDPCheckpointManager, unedited), FSDP1 and
FSDP2, at one and two gloo ranks on the CPU (verl_worker.py): the save writes containers and no
.pt; a resume in new processes through verl's load_checkpoint is in place and continues bit for
bit like the uninterrupted run, from the zckpt save and from a save made with verl's default
I/O; a flipped byte stops every rank's resume. Also `zckpt merge --files optim` of what verl's
FSDP1 wrote, at one rank and at two, against FSDP's own full_optim_state_dict.

Run by tools/ci/frameworks.sh with a Python that has verl (its cached virtualenv)."""
import os
import shutil
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

import zckpt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import verl_worker  # noqa: E402
import gloo_ranks  # noqa: E402

WORLD_SIZES = (1, 2)


def _spawn(phase, ws, root):
    return gloo_ranks.spawn(os.path.join(HERE, "verl_worker.py"), ws, phase, root)


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda ws: f"ws{ws}")
def saved(request, tmp_path_factory):
    ws = request.param
    root = str(tmp_path_factory.mktemp(f"verl{ws}"))
    _spawn("save", ws, root)
    return ws, root


@pytest.mark.parametrize("strategy", verl_worker.STRATEGIES)
def test_verl_save_writes_containers_only_and_each_verifies(saved, strategy):
    ws, root = saved
    folder = verl_worker.actor_dir(root, strategy, "z")
    names = sorted(os.listdir(folder))
    assert not [n for n in names if n.endswith(".pt")], names
    want = {f"{f}_world_size_{ws}_rank_{r}.zckpt" for f in ("model", "optim", "extra_state") for r in range(ws)}
    assert want <= set(names), names
    for name in want:
        assert zckpt.verify(os.path.join(folder, name)) is not None
    assert os.path.exists(os.path.join(folder, "fsdp_config.json"))  # verl's own files stay verl's


def test_verl_resume_in_place_continues_bit_for_bit_from_zckpt_and_default_saves(saved):
    ws, root = saved
    results = _spawn("resume", ws, root)
    for r, res in results.items():
        assert len(res) == len(verl_worker.STRATEGIES) * 2 * 4, sorted(res)
        bad = {k: v for k, v in res.items() if v is not None}
        assert not bad, (r, bad)


def test_verl_resume_of_a_flipped_byte_stops_every_rank(saved, tmp_path):
    ws, root = saved
    for strategy in verl_worker.STRATEGIES:
        bad = os.path.join(root, strategy, "bad")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(verl_worker.actor_dir(root, strategy, "z"), bad)
        victim = os.path.join(bad, f"optim_world_size_{ws}_rank_{min(verl_worker.BAD_RANK, ws - 1)}.zckpt")
        gloo_ranks.flip_chunk_byte(victim)
    results = _spawn("corrupt", ws, root)
    for r, res in results.items():
        for strategy in verl_worker.STRATEGIES:
            got = res[f"{strategy}: raised"]
            assert got is not None, f"rank {r} {strategy}: the resume went on"
            if r == min(verl_worker.BAD_RANK, ws - 1):
                assert got["class"] == "CorruptError", got
                assert f"optim_world_size_{ws}_rank_{r}.zckpt" in got["message"] and "chunk" in got["message"], got
            else:
                assert f"rank {verl_worker.BAD_RANK}" in got["message"] and "CorruptError" in got["message"], got


def test_verl_fsdp1_merge_of_optim_equals_fsdp_full_optim_state_dict(saved, tmp_path):
    # At one rank FSDP1 runs NO_SHARD and verl's files hold whole FlatParameters: the merge
    # still gives each parameter's moments, as at two ranks.
    ws, root = saved
    full = torch.load(os.path.join(root, "fsdp", "full_optim.pt"), weights_only=False)["state"]
    want = {f"state.{fqn}.{k}": v for fqn, entries in full.items() for k, v in entries.items()
            if isinstance(v, torch.Tensor)}
    for kind in ("pt", "z"):
        out = tmp_path / f"optim_{kind}.zckpt"
        r = gloo_ranks.cli("merge", verl_worker.actor_dir(root, "fsdp", kind), "--files", "optim", "-o", out)
        assert r.returncode == 0, r.stdout + r.stderr
        got = zckpt.load(out)
        assert sorted(got) == sorted(want), (kind, sorted(got)[:4], sorted(want)[:4])
        for k in want:
            assert got[k].shape == want[k].shape and torch.equal(got[k], want[k]), (kind, k)
