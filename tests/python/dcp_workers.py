"""The one spawned process group of tests/python/test_dcp.py (not a test module).

Four gloo ranks on the CPU, with sub-groups of 1, 2 and 3 ranks standing in for other world
sizes, so a single spawn (process start-up and `import torch` dominate the cost) covers: saving
FSDP2 (fully_shard) + AdamW at world sizes 4, 2 and 1 and FSDP1 at 4, each through
ZckptStorageWriter and DCP's own FileSystemWriter; loading each at 1, 2 and 3 ranks through both
readers into fresh models; verl-style per-rank files (torch.save of the sharded state dicts) and
the full state dicts torch itself gathers, for the merge and reshard tests; a corrupt chunk.
Every comparison that needs the live models is asserted here (a failure raises in the rank and
fails the spawn); what the parent checks is written to results.json by rank 0.
"""
import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zckpt.dcp import ZckptStorageReader, ZckptStorageWriter

CHUNK = 4096  # small chunks, so a rank's share of a tensor is a few chunks of many
SAVE_SIZES = {"fsdp2": (4, 2, 1), "fsdp1": (4,)}
LOAD_SIZES = (1, 2, 3)


def _net(seed):
    torch.manual_seed(seed)
    # Uneven shards at 3 and 4 ranks (23 rows, 10 rows); the embedding spans 8 chunks of 4 KiB.
    return torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 23), torch.nn.ReLU(),
                               torch.nn.Linear(23, 10))


def _fsdp2(mesh, seed):
    from torch.distributed.fsdp import fully_shard

    m = _net(seed)
    for layer in (m[0], m[1], m[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def _fsdp1(group, seed):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP(_net(seed), process_group=group, device_id=torch.device("cpu"))


def _trained(kind, n, groups, meshes, seed, steps=2):
    m = _fsdp2(meshes[n], seed) if kind == "fsdp2" else _fsdp1(groups[n], seed)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    torch.manual_seed(1000)
    for _ in range(steps):
        m(torch.randint(0, 256, (6,))).sum().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def _local(t):
    if hasattr(t, "to_local"):
        return t.to_local()
    if hasattr(t, "local_tensor"):
        return t.local_tensor()
    return t


def _live_tensors(m, opt):
    """name -> this rank's local tensor of every parameter and optimizer moment, live objects."""
    out = {f"param.{k}": _local(v) for k, v in m.named_parameters()}
    for idx, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"optim.{idx}.{k}"] = _local(v)
    return out


def _load(kind, n, groups, meshes, reader):
    # Other weights, zero moments (get_state_dict initialises them): the load must replace all.
    m, opt = _trained(kind, n, groups, meshes, seed=99, steps=0)
    msd, osd = get_state_dict(m, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=reader, process_group=groups[n])
    set_state_dict(m, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return m, opt


def worker(rank, root, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType

    groups = {n: dist.new_group(list(range(n))) for n in (1, 2, 3, 4)}
    meshes = {n: DeviceMesh.from_group(groups[n], "cpu") for n in (1, 2, 3, 4) if rank < n}
    results = {"compared": [], "reads": []}

    # ----- saves --------------------------------------------------------------------------
    for kind, sizes in SAVE_SIZES.items():
        for s in sizes:
            if rank < s:
                m, opt = _trained(kind, s, groups, meshes, seed=7)
                msd, osd = get_state_dict(m, opt)
                state = {"model": msd, "optim": osd, "extra": {"step": 2, "note": "dcp"}}
                base = f"{root}/{kind}_s{s}"
                dcp.save(state, storage_writer=ZckptStorageWriter(f"{base}/zckpt", chunk_bytes=CHUNK),
                         process_group=groups[s])
                dcp.save(state, storage_writer=FileSystemWriter(f"{base}/fs"), process_group=groups[s])
                if s == 4:
                    # verl's layout: each rank's sharded model state dict, torch.save'd.
                    os.makedirs(f"{root}/verl_{kind}/huggingface", exist_ok=True)
                    if kind == "fsdp2":
                        sd = m.state_dict()
                        full = {k: v.full_tensor() for k, v in sd.items()}
                    else:
                        with FSDP.state_dict_type(m, StateDictType.SHARDED_STATE_DICT):
                            sd = m.state_dict()
                        cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                        with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT, cfg):
                            full = m.state_dict()
                    torch.save(sd, f"{root}/verl_{kind}/model_world_size_4_rank_{rank}.pt")
                    if rank == 0:
                        torch.save({k: v.clone() for k, v in full.items()}, f"{root}/full_{kind}.pt")
                        with open(f"{root}/verl_{kind}/huggingface/config.json", "w") as f:
                            json.dump({"model_type": "toy"}, f)
            dist.barrier()

    # ----- loads at 1, 2 and 3 ranks: zckpt's reader against DCP's own --------------------------
    for kind, sizes in SAVE_SIZES.items():
        for s in sizes:
            for n in LOAD_SIZES:
                if rank < n:
                    base = f"{root}/{kind}_s{s}"
                    zr = ZckptStorageReader(f"{base}/zckpt")
                    mz, oz = _load(kind, n, groups, meshes, zr)
                    mf, of = _load(kind, n, groups, meshes, FileSystemReader(f"{base}/fs"))
                    a, b = _live_tensors(mz, oz), _live_tensors(mf, of)
                    # FSDP2: 5 parameters with 3 AdamW states each; FSDP1: one flat parameter (the
                    # live storage every original parameter views) with its 3 states.
                    assert a.keys() == b.keys() and len(a) == (20 if kind == "fsdp2" else 4), (sorted(a), sorted(b))
                    for k in a:
                        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), (kind, s, n, k)
                    assert oz.state_dict()["param_groups"] == of.state_dict()["param_groups"]
                    needed = sum(t.numel() * t.element_size() for t in a.values())
                    results["reads"].append({"kind": kind, "saved": s, "loaded": n, "rank": rank,
                                             "needed": needed, "read": zr.last_read["stored_bytes"],
                                             "regions": zr.last_read["regions"]})
                    if rank == 0:
                        results["compared"].append([kind, s, n, len(a)])
                    if kind == "fsdp2" and s == 4 and n == 3:
                        # What torch saves at 3 ranks, for the reshard test to hold its files against.
                        os.makedirs(f"{root}/verl_fsdp2_at3", exist_ok=True)
                        torch.save(mz.state_dict(), f"{root}/verl_fsdp2_at3/model_world_size_3_rank_{rank}.pt")
                dist.barrier()

    # ----- a corrupt chunk in one rank's file fails the load, naming file and byte range ------
    if rank == 0:
        import zckpt_testing

        src, bad = f"{root}/fsdp2_s4/zckpt", f"{root}/corrupt"
        shutil.copytree(src, bad)
        target = f"{bad}/__1_0.zckpt"
        storage = zckpt_testing.storage_of(target, "model.0.weight@64,0")
        zckpt_testing.flip_byte(target, storage["offset"] + 100)
    dist.barrier()
    if rank < 2:
        try:
            _load("fsdp2", 2, groups, meshes, ZckptStorageReader(f"{root}/corrupt"))
            results["corrupt_error"] = None
        except (Exception, CheckpointException) as e:  # DCP raises the failing rank's error on every rank
            results["corrupt_error"] = f"{type(e).__name__}: {e}"
        with open(f"{root}/corrupt_rank{rank}.txt", "w") as f:
            f.write(str(results["corrupt_error"]))
    dist.barrier()

    with open(f"{root}/results_rank{rank}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
