"""A verl-style resume through zckpt: FSDP1 and FSDP2 models on CPU/gloo ranks.

For each strategy (verl's `strategy: fsdp`, i.e. FSDP1 `FullyShardedDataParallel`, and
`strategy: fsdp2`, i.e. `fully_shard`), `--world-size` ranks (default 2, spawned with
torch.multiprocessing, gloo):

1. train a small language model (dropout, AdamW, a warm-up LambdaLR) for a few steps;
2. save the checkpoint as verl's FSDPCheckpointManager does (verl 0.9.1,
   verl/utils/checkpoint/fsdp_checkpoint_manager.py, save_checkpoint): per rank, under FSDP1's
   SHARDED_STATE_DICT, torch.save of model.state_dict(), optimizer.state_dict() and
   {'lr_scheduler', 'rng'} as model/optim/extra_state_world_size_W_rank_R.pt, plus
   fsdp_config.json;
3. convert the folder offline (`zckpt convert DIR -o OUTDIR`, or zckpt.convert per file);
4. resume into a freshly built model and optimizer (another seed): zckpt.load_into for the model
   (FSDP1: straight into each rank's FlatParameter shard; FSDP2: into each DTensor's local
   shard) and for the optimizer, zckpt.load for the extra state;
5. check on every rank: the module's own parameters (not a state-dict copy: FSDP1's
   FlatParameter shards, FSDP2's local shards), every optimizer moment, the param groups,
   scheduler and RNG states equal the saved run's, and the next step gives the loss and
   parameters of the run continuing from the checkpoint, bit for bit.

Prints what it did and `verl resume: OK` (exit 0), or `verl resume: FAILED: <what differs>`
(exit 1). Run it where the built package is importable:

    meson devenv -C build python $PWD/tools/examples/verl_resume.py [--world-size 2] [--strategy fsdp|fsdp2|both]
"""
import argparse
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zckpt
import zckpt.verl

VOCAB, DIM = 61, 24


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 3 * DIM + 1), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(3 * DIM + 1, DIM))

    def forward(self, h):
        return h + self.mlp(self.norm(h))


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))
        self.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        h = self.embed_tokens(idx)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm(h))


def build(strategy, seed):
    torch.manual_seed(seed)
    model = TinyLM()
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler):
    """A batch that depends on all three RNGs verl restores (torch: tokens and dropout; random:
    sequence length; numpy: a loss scale), different on each rank."""
    model.train()
    seq = random.randint(8, 16)
    idx = torch.randint(0, VOCAB, (4, seq))
    scale = float(np.random.uniform(0.5, 1.5))
    loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, VOCAB), idx[:, 1:].reshape(-1)) * scale
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


# ----- what verl's FSDPCheckpointManager does ------------------------------------------------

def state_ctx(model):
    """verl/utils/fsdp_utils.py get_fsdp_state_ctx: FSDP1's SHARDED_STATE_DICT, FSDP2 nothing."""
    import contextlib

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType

    if isinstance(model, FSDP):
        return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                                    ShardedOptimStateDictConfig())
    return contextlib.nullcontext()


def get_rng_state():
    return {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}


def load_rng_state(state):
    torch.set_rng_state(state["cpu"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])


def shard_names(world_size, rank):
    return {kind: f"{kind}_world_size_{world_size}_rank_{rank}" for kind in ("model", "optim", "extra_state")}


def save_checkpoint(local_path, model, optimizer, scheduler, strategy, world_size, rank):
    import warnings

    os.makedirs(local_path, exist_ok=True)
    names = shard_names(world_size, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1's ShardedTensor deprecation notes
        with state_ctx(model):
            torch.save(model.state_dict(), os.path.join(local_path, names["model"] + ".pt"))
            torch.save(optimizer.state_dict(), os.path.join(local_path, names["optim"] + ".pt"))
            torch.save({"lr_scheduler": scheduler.state_dict(), "rng": get_rng_state()},
                       os.path.join(local_path, names["extra_state"] + ".pt"))
    if rank == 0:
        with open(os.path.join(local_path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 1 if strategy == "fsdp" else 2, "world_size": world_size}, f)


# zckpt.load_into fills the optimizer's state tensors in place, so a fresh optimizer needs them
# first: zckpt.verl's zero-gradient step at lr 0 (what use_zckpt's resume does too).
init_optimizer_state = zckpt.verl.make_optimizer_state


def load_checkpoint(local_path, model, optimizer, scheduler, world_size, rank):
    """verl's load_checkpoint with its three torch.load calls replaced (see README.md)."""
    names = shard_names(world_size, rank)
    zckpt.load_into(os.path.join(local_path, names["model"] + ".zckpt"), model)
    init_optimizer_state(optimizer)
    zckpt.load_into(os.path.join(local_path, names["optim"] + ".zckpt"), optimizer)
    extra = zckpt.load(os.path.join(local_path, names["extra_state"] + ".zckpt"), weights_only=False)
    load_rng_state(extra["rng"])
    scheduler.load_state_dict(extra["lr_scheduler"])


# ----- the checks ---------------------------------------------------------------------------

class Mismatch(Exception):
    pass


def expect(ok, what):
    if not ok:
        raise Mismatch(what)


def live_parameters(model):
    """What the module itself trains: FSDP1's FlatParameter shards, FSDP2's local shards."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        return {f"flat_param[{i}]": m._handle.flat_param.detach().clone()
                for i, m in enumerate(FSDP.fsdp_modules(model)) if m._handle is not None}
    return {k: v.to_local().detach().clone() for k, v in model.named_parameters()}


def live_optimizer(optimizer):
    out = {}
    for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        for k, v in optimizer.state[p].items():
            out[f"state[{i}][{k}]"] = (v.to_local() if hasattr(v, "to_local") else v).clone()
    return out


def same(a, b, what):
    expect(a.keys() == b.keys(), f"{what}: names differ")
    for k in a:
        expect(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), f"{what}: {k} differs")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rank_main(rank, world_size, port, strategy, workdir, steps, zckpt_bin, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        torch.set_num_threads(1)  # bit-exact comparisons of two runs
        queue.put((rank, "ok", run_rank(rank, world_size, strategy, workdir, steps, zckpt_bin)))
    except Mismatch as e:
        queue.put((rank, "mismatch", str(e)))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_rank(rank, world_size, strategy, workdir, steps, zckpt_bin):
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(100 + rank)
    model, optimizer, scheduler = build(strategy, seed=0)
    torch.manual_seed(200 + rank)
    for _ in range(steps):
        train_step(model, optimizer, scheduler)
    actor_pt = os.path.join(workdir, strategy, "checkpoints", f"global_step_{steps}", "actor")
    save_checkpoint(actor_pt, model, optimizer, scheduler, strategy, world_size, rank)
    saved_params, saved_optim = live_parameters(model), live_optimizer(optimizer)
    saved_groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    continued_loss = train_step(model, optimizer, scheduler)  # the original run goes on
    continued_params = live_parameters(model)

    actor_z = os.path.join(workdir, strategy, "checkpoints_zckpt", f"global_step_{steps}", "actor")
    dist.barrier()
    if rank == 0:  # one converts the folder, as one would offline
        if zckpt_bin:
            subprocess.run([zckpt_bin, "convert", actor_pt, "-o", actor_z, "--quiet", "--force"], check=True)
        else:
            os.makedirs(actor_z, exist_ok=True)
            for name in sorted(os.listdir(actor_pt)):
                src = os.path.join(actor_pt, name)
                if name.endswith(".pt"):
                    zckpt.convert(src, os.path.join(actor_z, name[:-3] + ".zckpt"))
                else:
                    shutil.copyfile(src, os.path.join(actor_z, name))
        for name in os.listdir(actor_z):
            if name.endswith(".zckpt"):
                problems = zckpt.verify(os.path.join(actor_z, name), raise_on_error=False)
                expect(problems == [], f"{name} does not verify: {problems}")
    dist.barrier()

    fresh, fresh_opt, fresh_sched = build(strategy, seed=1)
    before = live_parameters(fresh)
    expect(any(not torch.equal(before[k], saved_params[k]) for k in before), "the fresh model equals the saved one")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    load_checkpoint(actor_z, fresh, fresh_opt, fresh_sched, world_size, rank)
    same(live_parameters(fresh), saved_params, "live parameters")
    same(live_optimizer(fresh_opt), saved_optim, "optimizer state")
    expect([{k: v for k, v in g.items() if k != "params"} for g in fresh_opt.param_groups] == saved_groups,
           "optimizer param_groups differ")
    resumed_loss = train_step(fresh, fresh_opt, fresh_sched)
    expect(resumed_loss == continued_loss, f"next-step loss {resumed_loss!r} != continued run's {continued_loss!r}")
    same(live_parameters(fresh), continued_params, "parameters after the next step")
    return {"files": sorted(os.listdir(actor_z)), "params": len(saved_params), "optim": len(saved_optim),
            "loss": resumed_loss, "rss_before_kib": peak_before,
            "rss_after_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def run(workdir, steps, zckpt_bin, world_size, strategies):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    for strategy in strategies:
        queue = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, world_size, port, strategy, workdir, steps, zckpt_bin, queue))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results = dict((r, (status, out)) for r, status, out in (queue.get() for _ in procs))
        for p in procs:
            p.join()
        for r in sorted(results):
            status, out = results[r]
            if status == "error":
                raise RuntimeError(f"{strategy} rank {r}:\n{out}")
            expect(status == "ok", f"{strategy} rank {r}: {out}")
        label = "FSDP1 FullyShardedDataParallel" if strategy == "fsdp" else "FSDP2 fully_shard"
        first = results[0][1]
        print(f"{strategy} ({label}), world size {world_size}: saved and converted {', '.join(first['files'])}")
        for r in sorted(results):
            out = results[r][1]
            print(f"  rank {r}: restored {out['params']} live parameter shards in place, {out['optim']} optimizer "
                  f"state tensors; next step: resumed loss {out['loss']!r} == continued loss")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="training steps before the checkpoint (default 4)")
    ap.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--strategy", choices=("fsdp", "fsdp2", "both"), default="both")
    ap.add_argument("--workdir", help="where the checkpoints go (default: a temporary folder, removed)")
    ap.add_argument("--zckpt-bin", default=None,
                    help="convert with this `zckpt` tool's folder mode instead of zckpt.convert per file")
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="verl-resume-")
    strategies = ("fsdp", "fsdp2") if args.strategy == "both" else (args.strategy,)
    try:
        run(workdir, args.steps, args.zckpt_bin, args.world_size, strategies)
        print(f"converted with {'zckpt convert DIR -o OUTDIR' if args.zckpt_bin else 'zckpt.convert per file'}")
    except Mismatch as e:
        print(f"verl resume: FAILED: {e}")
        return 1
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print("verl resume: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
