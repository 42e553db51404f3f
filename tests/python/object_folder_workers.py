"""Worker side of test_object_folders.py (not a test module): two gloo ranks (spawned, the S3
environment inherited from the test) that
  - save FSDP2 + AdamW state with dcp.save through ZckptStorageWriter to an object folder and to
    a local folder, then dcp.load each into fresh state (other weights, zero moments, another lr),
    and compare every tensor piece and non-tensor item with what was saved;
  - save FSDP1 per-rank files as verl does (fsdp_cases), convert them, upload each rank's
    containers into an object folder, and zckpt.load_into the model and optimizer from there and
    from the local folder: the live FlatParameter shards and moments must equal the saved run's,
    in place (no fallback to FSDP's load_state_dict, so the neighbour's rows came from the
    neighbour's object).
Each rank puts (rank, {check: None or problem}) on the queue."""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import fsdp_cases
from verl_resume import init_optimizer_state


def flat_items(obj, prefix=""):
    """{dotted path: value} of a nested state dict; DTensors as their local tensors, cloned."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_items(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_items(v, f"{prefix}.{i}" if prefix else str(i)))
    elif isinstance(obj, torch.Tensor):
        t = obj.to_local() if hasattr(obj, "to_local") else obj
        out[prefix] = t.detach().clone()
    else:
        out[prefix] = obj
    return out


def compare(got, want, what):
    """None when every item is equal (tensors: dtype, shape, values), else the problem."""
    if got.keys() != want.keys():
        return f"{what}: keys differ: {sorted(got.keys() ^ want.keys())[:6]}"
    bad = []
    for k, w in want.items():
        g = got[k]
        if isinstance(w, torch.Tensor):
            ok = isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
        else:
            ok = type(g) is type(w) and g == w
        if not ok:
            bad.append(k)
    return f"{what}: {len(bad)} of {len(want)} differ, e.g. {bad[:4]}" if bad else None


def _dcp_state(seed, steps, lr=None, note="s3"):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = fsdp_cases.build("fsdp2", seed=seed)
    for n in range(steps):
        fsdp_cases.step(model, opt, n)
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "extra": {"step": steps, "note": note}}


def dcp_case(rank, root, url, results):
    from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

    state = _dcp_state(seed=0, steps=2)
    saved = flat_items(state)
    local = os.path.join(root, "dcp_local")
    dcp.save(state, storage_writer=ZckptStorageWriter(url, chunk_bytes=4096))
    dcp.save(state, storage_writer=ZckptStorageWriter(local, chunk_bytes=4096))
    loaded = {}
    for where, path in (("s3", url), ("local", local)):
        fresh = _dcp_state(seed=9, steps=0, lr=0.5, note="fresh")
        before = flat_items(fresh)
        reader = ZckptStorageReader(path)
        dcp.load(fresh, storage_reader=reader)
        loaded[where] = flat_items(fresh)
        results[f"dcp {where}: fresh state differed before the load"] = (
            "the fresh state already equals the saved one: the test cannot fail"
            if compare(before, saved, "x") is None else None)
        results[f"dcp {where}: every tensor and item equals the saved state"] = compare(loaded[where], saved, where)
        files = [os.path.basename(f) for f in reader.last_read["files"]]
        results[f"dcp {where}: read this folder's containers"] = (
            None if files and all(f.endswith(".zckpt") for f in files)
            and all(f.startswith(path) for f in reader.last_read["files"]) else f"read {reader.last_read['files']}")
    results["dcp: load from s3 equals load from the local save"] = compare(loaded["s3"], loaded["local"], "s3 vs local")
    n = sum(1 for v in saved.values() if isinstance(v, torch.Tensor))
    results["dcp: tensors compared"] = None if n >= 10 else f"only {n} tensors"
    results["dcp: non-tensor items compared"] = (
        None if saved["extra.note"] == "s3" and isinstance(saved.get("optim.param_groups.0.lr"), float)
        else f"items: {[k for k, v in saved.items() if not isinstance(v, torch.Tensor)]}")


def fsdp1_case(rank, ws, root, url, results):
    import zckpt
    from zckpt import _C

    folder = os.path.join(root, "fsdp1")
    model, opt = fsdp_cases.build("fsdp1", seed=0)
    for n in range(2):
        fsdp_cases.step(model, opt, n)
    fsdp_cases.save_verl(folder, model, opt, ws, rank)
    saved_params, saved_optim = fsdp_cases.live_params(model), fsdp_cases.live_optim(opt)
    fsdp_cases.convert_own(folder, ws, rank)
    names = fsdp_cases.names(ws, rank)
    for stem in (names["model"], names["optim"]):
        with open(os.path.join(folder, stem + ".zckpt"), "rb") as f:
            _C.write_object(f"{url}/{stem}.zckpt", f.read())
    dist.barrier()  # every rank's containers uploaded (a rank reads its neighbour's)
    live = {}
    for where, base in (("s3", url), ("local", folder)):
        fresh, fopt = fsdp_cases.build("fsdp1", seed=1)
        init_optimizer_state(fopt)
        with fsdp_cases.warnings_caught() as caught:
            r_model = zckpt.load_into(f"{base}/{names['model']}.zckpt", fresh)
            r_optim = zckpt.load_into(f"{base}/{names['optim']}.zckpt", fopt)
        fell_back = [str(w.message) for w in caught if "not in place" in str(w.message)]
        results[f"fsdp1 {where}: load_into returned no missing or unexpected keys"] = (
            None if (r_model, r_optim) == (([], []), ([], [])) else f"{r_model}, {r_optim}")
        results[f"fsdp1 {where}: loaded in place, the neighbour's rows from its file"] = (
            None if not fell_back else f"fell back: {fell_back}")
        live[where] = fsdp_cases.live_params(fresh)
        results[f"fsdp1 {where}: live parameters equal the saved run's"] = fsdp_cases.diff(
            live[where], saved_params, "parameters")
        results[f"fsdp1 {where}: optimizer moments equal the saved run's"] = fsdp_cases.diff(
            fsdp_cases.live_optim(fopt), saved_optim, "optimizer state")
    results["fsdp1: load_into from s3 equals local"] = fsdp_cases.diff(live["s3"], live["local"], "s3 vs local")


def worker(rank, ws, port, root, dcp_url, fsdp_url, queue):
    def cases(results):
        dcp_case(rank, root, dcp_url, results)
        dist.barrier()
        fsdp1_case(rank, ws, root, fsdp_url, results)

    fsdp_cases.report(rank, ws, port, queue, cases)
