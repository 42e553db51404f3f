"""zckpt.load_into restores FSDP-sharded training state, live, on CPU/gloo ranks spawned with
torch.multiprocessing: FSDP1 (FullyShardedDataParallel, use_orig_params off and on, SHARDED and
FULL state dicts) and FSDP2 (fully_shard), at world sizes 2 and 1, saved as verl's
FSDPCheckpointManager saves (tests/python/fsdp_cases.py cites the lines mirrored).

For each configuration: the module's own parameters (FSDP1's FlatParameter shards and, through
summon_full_params, every full parameter; FSDP2's local shards), its buffers and every optimizer
moment equal the saved run's; the next step's loss and parameters equal the uninterrupted run's.
Refused: another rank's file, another world size (by name and, renamed, by shard metadata),
wrong shapes. One spawn per world size runs every case (the ranks are reused)."""
import os

import pytest
import torch

import fsdp_cases

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fsdp"))
    w2 = fsdp_cases.run(2, os.path.join(root, "w2"))
    w1 = fsdp_cases.run(1, os.path.join(root, "w1"), other_root=os.path.join(root, "w2"))
    return {2: w2, 1: w1}


def _checks(runs, ws, prefix):
    ranks = runs[ws]
    assert sorted(ranks) == list(range(ws)), f"ranks that reported: {sorted(ranks)}"
    for rank, results in ranks.items():
        assert "worker raised" not in results, results["worker raised"]
    out = {}
    for rank, results in ranks.items():
        for k, v in results.items():
            if k.startswith(prefix):
                out[(rank, k)] = v
    return out


def _assert_all_ok(checks, at_least):
    assert len(checks) >= at_least, sorted(checks)
    failed = {k: v for k, v in checks.items() if v is not None}
    assert not failed, "\n".join(f"rank {r}: {k}: {v}" for (r, k), v in failed.items())


RESUME_CHECKS = 7  # per kind and rank: see fsdp_cases.resume_case


@pytest.mark.parametrize("ws", [2, 1])
@pytest.mark.parametrize("kind", ["fsdp1:", "fsdp1_orig:", "fsdp2:"])
def test_resume_restores_live_state(runs, ws, kind):
    checks = {k: v for k, v in _checks(runs, ws, kind).items()
              if "refused" not in k[1] and "untouched" not in k[1] and "fall" not in k[1] and "verl" not in k[1]}
    _assert_all_ok(checks, RESUME_CHECKS * ws)
    names = {k for _, k in checks}
    assert f"{kind} live parameters equal the saved run's" in names
    assert f"{kind} optimizer moments equal the saved run's" in names
    assert f"{kind} next step's loss equals the continued run's" in names


def test_fsdp1_full_state_dict_world_size_2(runs):
    _assert_all_ok(_checks(runs, 2, "fsdp1 FULL_STATE_DICT:"), RESUME_CHECKS * 2)


def test_fsdp1_missing_neighbour_file_falls_back_to_fsdp_load(runs):
    _assert_all_ok(_checks(runs, 2, "fsdp1: a missing neighbour"), 2)
    _assert_all_ok(_checks(runs, 2, "fsdp1: fallback restores"), 2)


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_another_ranks_file_refused(runs, kind):
    _assert_all_ok(_checks(runs, 2, f"{kind}: another rank's"), 4)


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_another_world_size_refused(runs, kind):
    _assert_all_ok(_checks(runs, 1, f"{kind}: world size 2 file"), 2)


@pytest.mark.parametrize("ws", [2, 1])
def test_wrong_shapes_refused_untouched(runs, ws):
    _assert_all_ok(_checks(runs, ws, "fsdp1: wrong shapes") | _checks(runs, ws, "fsdp2: wrong shapes"), 4 * ws)


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_unedited_verl_load_through_patch_torch_load(runs, kind):
    """FSDPCheckpointManager.load_checkpoint's own calls (torch.load + load_state_dict), with
    zckpt.patch_torch_load redirecting each torch.load to the converted file."""
    _assert_all_ok(_checks(runs, 2, f"{kind}: verl load_checkpoint through patch_torch_load"), 8)
