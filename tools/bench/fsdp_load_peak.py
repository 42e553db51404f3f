"""Host peak memory of each way to resume an FSDP checkpoint, on CPU/gloo ranks.

Per rank, after building the model and optimizer, each path runs in turn with the peak RSS
reset before it (malloc_trim, then `/proc/self/clear_refs` 5, Linux >= 4.0); reported: the rise of VmHWM over the
RSS before the path, next to this rank's shard bytes. Paths:
  fsdp1 load_into        zckpt.load_into(model file, FSDP1 model): LoadRegions element runs into FlatParameter shards
  fsdp1 fallback         zckpt's FSDP fallback: shards streamed into ShardedTensors + FSDP load_state_dict
  fsdp1 torch.load       verl: torch.load(.pt) + load_state_dict under SHARDED_STATE_DICT
  fsdp2 load_into        zckpt.load_into(model file, fully_shard model): into DTensor local shards
  fsdp2 torch.load       verl: torch.load(.pt) + load_state_dict
  optim load_into        zckpt.load_into(optim file, optimizer)
  optim torch.load       verl: torch.load(.pt) + optimizer.load_state_dict

    meson devenv -C build python $PWD/tools/bench/fsdp_load_peak.py [--dim 1024] [--world-size 2]
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import zckpt


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def measure(fn):
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the OS: a later path re-touches it
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_kib("VmRSS")
    fn()
    return (rss_kib("VmHWM") - before) / 1024


def build(strategy, dim, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(8 * dim, dim), *[torch.nn.Sequential(
        torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(2 * dim, dim)) for _ in range(2)])
    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for m in model:
            if isinstance(m, torch.nn.Sequential):
                fully_shard(m)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return model, opt


def ctx(model):
    import contextlib

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT) if isinstance(model, FSDP) \
        else contextlib.nullcontext()


def rank_main(rank, ws, port, dim, root, queue):
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.set_num_threads(1)
    from zckpt import _fsdp

    out = {}
    for strategy in ("fsdp1", "fsdp2"):
        folder = os.path.join(root, strategy)
        os.makedirs(folder, exist_ok=True)
        model, opt = build(strategy, dim, 0)
        mp, op = (os.path.join(folder, f"{k}_world_size_{ws}_rank_{rank}") for k in ("model", "optim"))
        with ctx(model):
            torch.save(model.state_dict(), mp + ".pt")
            torch.save(opt.state_dict(), op + ".pt")
        zckpt.convert(mp + ".pt", mp + ".zckpt")
        zckpt.convert(op + ".pt", op + ".zckpt")
        shard = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        if strategy == "fsdp2":
            shard = sum(p.to_local().numel() * 4 for p in model.parameters()) / 2**20
        dist.barrier()
        del model, opt
        model, opt = build(strategy, dim, 1)
        out[f"{strategy} shard MiB"] = shard
        out[f"{strategy} load_into"] = measure(lambda: zckpt.load_into(mp + ".zckpt", model))

        def torch_path():
            with ctx(model):
                model.load_state_dict(torch.load(mp + ".pt", weights_only=False))

        out[f"{strategy} torch.load"] = measure(torch_path)
        if strategy == "fsdp1":
            out["fsdp1 fallback"] = measure(lambda: _fsdp.fsdp_fallback(mp + ".zckpt", model, True, True, "measured"))
            out["optim load_into"] = measure(lambda: zckpt.load_into(op + ".zckpt", opt))
            out["optim torch.load"] = measure(lambda: opt.load_state_dict(torch.load(op + ".pt", weights_only=False)))
        del model, opt
    queue.put((rank, out))
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from verl_resume import free_port

    port = free_port()
    ctx_ = mp.get_context("spawn")
    queue = ctx_.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="fsdp-peak-") as root:
        procs = [ctx_.Process(target=rank_main, args=(r, args.world_size, port, args.dim, root, queue))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        results = dict(queue.get() for _ in procs)
        for p in procs:
            p.join()
    keys = list(results[0])
    print("host peak rise, MiB (VmHWM - RSS before), per rank; world size", args.world_size, "dim", args.dim)
    for k in keys:
        print(f"  {k:24s} " + "  ".join(f"rank{r}: {results[r][k]:8.1f}" for r in sorted(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
