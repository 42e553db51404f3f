"""Worker side of test_reshard_resume.py (not a test module): spawned gloo ranks that train and save
the way verl 0.9.1 does (fsdp_cases.save_verl: FSDP1 under SHARDED_STATE_DICT, FSDP2 plain), and
ranks at another world size that resume what `zckpt reshard` wrote through verl's own
load_checkpoint path, next to a reference resume of the original through torch's full state dicts.

Phases (each rank writes results_<phase>_rank<R>.json: check name -> None or the problem):
  save:   W ranks, 3 steps, verl's save into ROOT/<kind>/src; rank 0 also writes the full state
          torch itself gathers (FSDP1: FULL_STATE_DICT and FSDP.optim_state_dict; FSDP2:
          get_model_state_dict / get_optimizer_state_dict with full_state_dict=True).
  resume: W' ranks. FSDP1: verl's load of ROOT/fsdp1/r<W'> (model then optimizer, under
          SHARDED_STATE_DICT) against a fresh model loaded from the full state through FSDP's
          FULL_STATE_DICT + optim_state_dict_to_load: live FlatParameter shards, every full
          parameter, every optimizer moment, the next step's loss and the parameters after it
          must be equal. FSDP2: verl's load of ROOT/fsdp2/r<W'>, then torch's own
          get_optimizer_state_dict(full_state_dict=True) of the resumed optimizer (it all-gathers
          the moments over the DTensors' mesh) must work and equal the original's.
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_cases import build, diff, join_group, live_optim, live_params, save_verl, state_ctx, step  # noqa: E402

SAVED_STEPS = 3


def _full_fsdp1(model, opt):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with state_ctx(model, full=True):
        msd = {k: v.clone() for k, v in model.state_dict().items()}
        osd = FSDP.optim_state_dict(model, opt)
    return msd, osd


def _full_fsdp2(model, opt):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True)
    return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)


def save_phase(rank, ws, root, results):
    for kind in ("fsdp1", "fsdp2", "fsdp1_orig"):
        model, opt = build(kind, seed=0)
        for n in range(SAVED_STEPS):
            step(model, opt, n)
        folder = os.path.join(root, kind, "src")
        save_verl(folder, model, opt, ws, rank)
        msd, osd = (_full_fsdp2 if kind == "fsdp2" else _full_fsdp1)(model, opt)
        if rank == 0:
            with open(os.path.join(folder, "fsdp_config.json"), "w") as f:
                json.dump({"FSDP_version": 2 if kind == "fsdp2" else 1, "world_size": ws}, f)
            torch.save({"model": msd, "optim": osd}, os.path.join(root, kind, "full_state.pt"))
        dist.barrier()


def _verl_load(kind, folder, ws, rank, seed):
    """FSDPCheckpointManager.load_checkpoint's model and optimizer loads (fsdp_cases)."""
    model, opt = build(kind, seed=seed)
    with state_ctx(model):
        model.load_state_dict(torch.load(os.path.join(folder, f"model_world_size_{ws}_rank_{rank}.pt"),
                                         weights_only=False))
        opt.load_state_dict(torch.load(os.path.join(folder, f"optim_world_size_{ws}_rank_{rank}.pt"),
                                       weights_only=False))
    return model, opt


def _reference_fsdp1(full):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model, opt = build("fsdp1", seed=2)
    with state_ctx(model, full=True):
        model.load_state_dict(full["model"])
        opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, full["optim"]))
    return model, opt


def _equal_nested(a, b, path=""):
    if isinstance(a, torch.Tensor):
        ok = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return None if ok else f"{path} differs"
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return f"{path}: keys {sorted(map(str, a))[:4]} vs {sorted(map(str, b))[:4] if isinstance(b, dict) else b}"
        for k in a:
            bad = _equal_nested(a[k], b[k], f"{path}.{k}")
            if bad:
                return bad
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            bad = _equal_nested(x, y, f"{path}.{i}")
            if bad:
                return bad
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def resume_phase(rank, ws, root, results):
    # FSDP1: the resharded files through verl's load path, against torch's full state dicts.
    full = torch.load(os.path.join(root, "fsdp1", "full_state.pt"), weights_only=False)
    label = f"fsdp1 2 -> {ws}"
    try:
        model, opt = _verl_load("fsdp1", os.path.join(root, "fsdp1", f"r{ws}"), ws, rank, seed=1)
    except Exception:  # noqa: BLE001 - what the unfixed reshard does: report it as the failure
        results[f"{label}: verl's load_checkpoint of the resharded files"] = traceback.format_exc()[-1500:]
        model = None
    if model is not None:
        ref, ref_opt = _reference_fsdp1(full)
        results[f"{label}: live parameters equal the full-state-dict resume's"] = diff(
            live_params(model), live_params(ref), "parameters")
        results[f"{label}: optimizer moments equal the full-state-dict resume's"] = diff(
            live_optim(opt), live_optim(ref_opt), "optimizer state")
        results[f"{label}: the moments are not all zero"] = (
            None if any(v.abs().sum() > 0 for k, v in live_optim(opt).items() if "exp_avg" in k) else "all zero")
        loss, ref_loss = step(model, opt, SAVED_STEPS), step(ref, ref_opt, SAVED_STEPS)
        results[f"{label}: next step's loss equals the full-state-dict resume's"] = (
            None if loss == ref_loss else f"{loss!r} != {ref_loss!r}")
        results[f"{label}: parameters after the next step equal"] = diff(live_params(model), live_params(ref), "after")

    # FSDP2: verl resumes; torch's own full optimizer state dict of the resumed optimizer works.
    full2 = torch.load(os.path.join(root, "fsdp2", "full_state.pt"), weights_only=False)
    label = f"fsdp2 2 -> {ws}"
    model, opt = _verl_load("fsdp2", os.path.join(root, "fsdp2", f"r{ws}"), ws, rank, seed=1)
    try:
        msd, osd = _full_fsdp2(model, opt)
        results[f"{label}: get_optimizer_state_dict(full_state_dict=True) of the resumed optimizer"] = (
            _equal_nested(osd, full2["optim"], "optim"))
        results[f"{label}: get_model_state_dict(full_state_dict=True) of the resumed model"] = (
            _equal_nested(msd, full2["model"], "model"))
    except Exception:  # noqa: BLE001
        results[f"{label}: get_optimizer_state_dict(full_state_dict=True) of the resumed optimizer"] = (
            traceback.format_exc()[-1500:])


def worker(rank, ws, port, phase, root):
    results = {}
    try:
        join_group(rank, ws, port)
        (save_phase if phase == "save" else resume_phase)(rank, ws, root, results)
    except Exception:  # noqa: BLE001 - reported to the test
        results["worker raised"] = traceback.format_exc()
    finally:
        with open(os.path.join(root, f"results_{phase}{ws}_rank{rank}.json"), "w") as f:
            json.dump(results, f)
        if dist.is_initialized():
            dist.destroy_process_group()
