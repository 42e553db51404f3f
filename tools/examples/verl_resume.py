"""A verl-style resume through zckpt, on the CPU.

1. Train a small language model with AdamW and a warm-up LambdaLR for a few steps.
2. Save the checkpoint the way verl's FSDP checkpoint manager does, one set of files per rank
   (here world size 1, rank 0) under global_step_N/actor/:
       model_world_size_1_rank_0.pt        model.state_dict()
       optim_world_size_1_rank_0.pt        optimizer.state_dict()
       extra_state_world_size_1_rank_0.pt  {'lr_scheduler': ..., 'rng': {cpu, [cuda], numpy, random}}
   plus fsdp_config.json, all with torch.save.
3. Convert the folder offline: zckpt.convert per file, or `zckpt convert DIR -o OUTDIR`
   (--zckpt-bin), which also copies fsdp_config.json.
4. Resume into a fresh model and optimizer (built from another seed): zckpt.load_into for the
   model and the optimizer (in place, no second copy of the weights), zckpt.load for the extra
   state (weights_only=False: the numpy RNG state is not on torch's allowlist).
5. Check: parameters, optimizer state, scheduler and RNG states equal what the .pt files hold,
   and the next training step gives exactly the loss (and parameters) of the original run
   continuing from the same point.

Prints `verl resume: OK` and exits 0 when every check holds; `verl resume: FAILED ...` and
exit 1 otherwise. Run it where the built package is importable:

    meson devenv -C build python $PWD/tools/examples/verl_resume.py [--steps N] [--workdir DIR]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import zckpt

VOCAB, DIM = 64, 32


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(2 * DIM, DIM))
            for _ in range(2))
        self.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied, as in many small LMs
        torch.nn.init.normal_(self.embed_tokens.weight, std=0.02)

    def forward(self, idx):
        h = self.embed_tokens(idx)
        for layer in self.layers:
            h = h + layer(h)
        return self.lm_head(self.norm(h))


def build(seed):
    torch.manual_seed(seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = 4
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda s: min(1.0, (s + 1) / warmup))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler):
    """One step whose batch depends on all three RNGs verl restores (torch: tokens and dropout;
    random: sequence length; numpy: a loss scale)."""
    model.train()
    seq = random.randint(8, 16)
    idx = torch.randint(0, VOCAB, (4, seq))
    scale = float(np.random.uniform(0.5, 1.5))
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1)) * scale
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


# ----- what verl's checkpoint manager does --------------------------------------------------

def get_rng_state():
    state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def load_rng_state(state):
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])


def shard_names(world_size=1, rank=0):
    return {kind: f"{kind}_world_size_{world_size}_rank_{rank}" for kind in ("model", "optim", "extra_state")}


def save_checkpoint(local_path, model, optimizer, scheduler, world_size=1, rank=0):
    os.makedirs(local_path, exist_ok=True)
    names = shard_names(world_size, rank)
    torch.save(model.state_dict(), os.path.join(local_path, names["model"] + ".pt"))
    torch.save(optimizer.state_dict(), os.path.join(local_path, names["optim"] + ".pt"))
    extra = {"lr_scheduler": scheduler.state_dict(), "rng": get_rng_state()}
    torch.save(extra, os.path.join(local_path, names["extra_state"] + ".pt"))
    if rank == 0:
        with open(os.path.join(local_path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 1, "world_size": world_size}, f)


def init_optimizer_state(optimizer):
    """zckpt.load_into fills the optimizer's state tensors in place, so they must exist: a
    fresh optimizer gets them from one step with zero gradients at lr 0 (what
    torch.distributed.checkpoint does before loading an optimizer)."""
    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def load_checkpoint(local_path, model, optimizer, scheduler, world_size=1, rank=0):
    """verl's load_checkpoint with the three torch.load calls replaced (see README.md)."""
    names = shard_names(world_size, rank)
    zckpt.load_into(os.path.join(local_path, names["model"] + ".zckpt"), model)
    init_optimizer_state(optimizer)
    zckpt.load_into(os.path.join(local_path, names["optim"] + ".zckpt"), optimizer)
    extra = zckpt.load(os.path.join(local_path, names["extra_state"] + ".zckpt"), weights_only=False)
    if "rng" in extra:
        load_rng_state(extra["rng"])
    if extra["lr_scheduler"] is not None:
        scheduler.load_state_dict(extra["lr_scheduler"])


def convert_folder(src, dst, zckpt_bin=None):
    if zckpt_bin:
        subprocess.run([zckpt_bin, "convert", src, "-o", dst, "--quiet"], check=True)
        return
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        if name.endswith(".pt"):
            zckpt.convert(os.path.join(src, name), os.path.join(dst, name[:-3] + ".zckpt"))
        else:
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


# ----- the checks ---------------------------------------------------------------------------

class Mismatch(Exception):
    pass


def expect(ok, what):
    if not ok:
        raise Mismatch(what)


def same_tensors(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check_restored(actor_pt, model, optimizer, scheduler):
    names = shard_names()
    saved_model = torch.load(os.path.join(actor_pt, names["model"] + ".pt"), weights_only=True)
    saved_optim = torch.load(os.path.join(actor_pt, names["optim"] + ".pt"), weights_only=True)
    saved_extra = torch.load(os.path.join(actor_pt, names["extra_state"] + ".pt"), weights_only=False)
    current = model.state_dict()
    expect(list(current) == list(saved_model), "model keys differ")
    for k, v in saved_model.items():
        expect(same_tensors(current[k], v), f"model tensor {k} differs")
    now = optimizer.state_dict()
    expect(sorted(now["state"]) == sorted(saved_optim["state"]), "optimizer state keys differ")
    for idx, st in saved_optim["state"].items():
        for k, v in st.items():
            expect(same_tensors(now["state"][idx][k], v), f"optimizer state[{idx}][{k}] differs")
    expect(now["param_groups"] == saved_optim["param_groups"], "optimizer param_groups differ")
    expect(scheduler.state_dict() == saved_extra["lr_scheduler"], "lr_scheduler state differs")
    expect(torch.equal(torch.get_rng_state(), saved_extra["rng"]["cpu"]), "torch RNG state differs")
    np_now, np_saved = np.random.get_state(), saved_extra["rng"]["numpy"]
    expect(np.array_equal(np_now[1], np_saved[1]) and np_now[2:] == np_saved[2:], "numpy RNG state differs")
    expect(random.getstate() == saved_extra["rng"]["random"], "random RNG state differs")
    return len(saved_model), sum(len(st) for st in saved_optim["state"].values())


def run(workdir, steps, zckpt_bin):
    torch.set_num_threads(1)  # bit-exact comparisons of two runs
    random.seed(0)
    np.random.seed(0)
    model, optimizer, scheduler = build(seed=0)
    losses = [train_step(model, optimizer, scheduler) for _ in range(steps)]
    actor_pt = os.path.join(workdir, "checkpoints", f"global_step_{steps}", "actor")
    save_checkpoint(actor_pt, model, optimizer, scheduler)
    continued_loss = train_step(model, optimizer, scheduler)  # the original run goes on
    continued_params = {k: v.detach().clone() for k, v in model.named_parameters()}

    actor_z = os.path.join(workdir, "checkpoints_zckpt", f"global_step_{steps}", "actor")
    convert_folder(actor_pt, actor_z, zckpt_bin)
    for name in shard_names().values():
        problems = zckpt.verify(os.path.join(actor_z, name + ".zckpt"), raise_on_error=False)
        expect(problems == [], f"{name}.zckpt does not verify: {problems}")
    expect(os.path.exists(os.path.join(actor_z, "fsdp_config.json")), "fsdp_config.json not carried over")

    # A fresh process would start here: other seeds, other RNG positions.
    random.seed(123)
    np.random.seed(123)
    fresh, fresh_opt, fresh_sched = build(seed=123)
    expect(not torch.equal(fresh.embed_tokens.weight, model.embed_tokens.weight), "fresh model is not fresh")
    ptrs = {k: v.data_ptr() for k, v in fresh.state_dict(keep_vars=True).items()}
    load_checkpoint(actor_z, fresh, fresh_opt, fresh_sched)
    expect({k: v.data_ptr() for k, v in fresh.state_dict(keep_vars=True).items()} == ptrs,
           "load_into moved a parameter")
    n_model, n_optim = check_restored(actor_pt, fresh, fresh_opt, fresh_sched)

    resumed_loss = train_step(fresh, fresh_opt, fresh_sched)
    expect(resumed_loss == continued_loss, f"next-step loss {resumed_loss!r} != continued run's {continued_loss!r}")
    for k, v in fresh.named_parameters():
        expect(torch.equal(v.detach(), continued_params[k]), f"parameter {k} differs after the next step")
    print(f"trained {steps} steps, losses {[round(x, 4) for x in losses]}")
    print(f"saved {actor_pt}: " + ", ".join(sorted(os.listdir(actor_pt))))
    print(f"converted to {actor_z} ({'zckpt convert DIR -o OUTDIR' if zckpt_bin else 'zckpt.convert per file'})")
    print(f"restored {n_model} model tensors in place, {n_optim} optimizer state tensors, "
          f"lr {fresh_opt.param_groups[0]['lr']:.6g}, RNG cpu/numpy/random")
    print(f"next step: resumed loss {resumed_loss!r} == continued loss {continued_loss!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps before the checkpoint (default 5)")
    ap.add_argument("--workdir", help="where the checkpoints go (default: a temporary folder, removed)")
    ap.add_argument("--zckpt-bin", default=None,
                    help="convert with this `zckpt` tool's folder mode instead of zckpt.convert per file")
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="verl-resume-")
    try:
        run(workdir, args.steps, args.zckpt_bin)
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
