"""Worker side of test_fsdp.py (not a test module): runs in each rank of a gloo process group
(torch.multiprocessing spawn), saves the way verl's FSDPCheckpointManager saves, converts,
restores into a fresh model and optimizer with zckpt.load_into, and reports what it found.

What verl 0.9.1 does (verl/utils/checkpoint/fsdp_checkpoint_manager.py), mirrored here:
  save_checkpoint, lines 303-346: under FSDP.state_dict_type(model, SHARDED_STATE_DICT,
    ShardedStateDictConfig(offload_to_cpu=...), ShardedOptimStateDictConfig(...)) (FSDP1 only,
    verl/utils/fsdp_utils.py:445 get_fsdp_state_ctx; FSDP2: a null context):
      torch.save(model.state_dict(), f"model_world_size_{W}_rank_{R}.pt")
      torch.save(optimizer.state_dict(), f"optim_world_size_{W}_rank_{R}.pt")
      torch.save({"lr_scheduler": ..., "rng": ...}, f"extra_state_world_size_{W}_rank_{R}.pt")
  load_checkpoint, lines 215-257: the same context, then
      model.load_state_dict(torch.load(model_path, weights_only=False))
      optimizer.load_state_dict(torch.load(optim_path, weights_only=False))
Each rank's result is a dict put on a queue: check name -> None (ok) or the problem.
"""
import os
import shutil
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "examples"))
from verl_resume import free_port, init_optimizer_state  # noqa: E402  (one copy: the example's)

VOCAB, DIM, HIDDEN = 29, 6, 13  # sizes chosen so FSDP1's flat shards cut parameters mid-way


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.layers = torch.nn.ModuleList([Block() for _ in range(2)])
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, VOCAB, bias=False)
        self.register_buffer("scale", torch.tensor(0.5))
        # Not in the state dict (a rotary embedding's inv_freq in Llama): load_into must not want it.
        self.register_buffer("inv_freq", torch.arange(3.0), persistent=False)

    def forward(self, idx):
        h = self.embed(idx)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h)) * self.scale


def build(kind, seed, dim=DIM):
    """A wrapped TinyLM and its AdamW. kind: fsdp1, fsdp1_orig (use_orig_params), fsdp2."""
    torch.manual_seed(seed)
    model = TinyLM(dim)
    if kind.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=kind == "fsdp1_orig",
                     device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)
    return model, opt


def step(model, opt, n):
    g = torch.Generator().manual_seed(1000 + n)
    idx = torch.randint(0, VOCAB, (4, 9), generator=g)
    loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def state_ctx(model, full=False):
    """verl's get_fsdp_state_ctx (fsdp_utils.py:445): FSDP1's state_dict_type, else nothing."""
    import contextlib

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig, ShardedOptimStateDictConfig,
                                        ShardedStateDictConfig, StateDictType)

    if not isinstance(model, FSDP):
        return contextlib.nullcontext()
    if full:
        return FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                    FullOptimStateDictConfig(rank0_only=False))
    return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                                ShardedOptimStateDictConfig())


def names(ws, rank):
    return {k: f"{k}_world_size_{ws}_rank_{rank}" for k in ("model", "optim", "extra_state")}


def save_verl(folder, model, opt, ws, rank, full=False):
    """FSDPCheckpointManager.save_checkpoint's three torch.save calls (lines 303-346)."""
    import warnings

    os.makedirs(folder, exist_ok=True)
    n = names(ws, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with state_ctx(model, full):
            torch.save(model.state_dict(), os.path.join(folder, n["model"] + ".pt"))
            torch.save(opt.state_dict(), os.path.join(folder, n["optim"] + ".pt"))
            torch.save({"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}},
                       os.path.join(folder, n["extra_state"] + ".pt"))


def convert_own(folder, ws, rank):
    import zckpt

    for stem in names(ws, rank).values():
        zckpt.convert(os.path.join(folder, stem + ".pt"), os.path.join(folder, stem + ".zckpt"))


def live_params(model):
    """What the module itself holds, not a state-dict copy: FSDP1's FlatParameter shards and
    (through summon_full_params, FSDP's own all-gather) every full parameter; FSDP2's local
    shards."""
    out = {}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        for i, m in enumerate(FSDP.fsdp_modules(model)):
            if m._handle is not None:
                out[f"flat{i}"] = m._handle.flat_param.detach().clone()
        with FSDP.summon_full_params(model):
            for k, v in model.named_parameters():
                out["full:" + k] = v.detach().clone()
    else:
        for k, v in model.named_parameters():
            out[k] = v.to_local().detach().clone() if hasattr(v, "to_local") else v.detach().clone()
    for k, v in model.named_buffers():
        out["buffer:" + k] = v.detach().clone()
    return out


def live_optim(opt):
    out = {}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            out[f"{i}.{k}"] = v.to_local().clone() if hasattr(v, "to_local") else v.clone()
    return out


def diff(a, b, what):
    if a.keys() != b.keys():
        return f"{what}: keys differ: {sorted(a.keys() ^ b.keys())[:5]}"
    bad = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]))]
    return f"{what}: {len(bad)} differ, e.g. {bad[:4]}" if bad else None


def expect_refusal(fn, *needles):
    import zckpt

    try:
        fn()
    except zckpt.ZckptError as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        return f"refused, but the message lacks {missing}: {msg}" if missing else None
    return "was not refused"


def resume_case(kind, folder, ws, rank, results, full=False):
    """Save (verl's way) after 2 steps, run on; restore a fresh model/optimizer (other seed) with
    zckpt.load_into; the live state must equal the saved one and the next step the run's."""
    import zckpt

    kind_label = kind
    kind = kind.split()[0]
    model, opt = build(kind, seed=0)
    for n in range(2):
        step(model, opt, n)
    save_verl(folder, model, opt, ws, rank, full)
    saved_params, saved_optim = live_params(model), live_optim(opt)
    loss_continued = step(model, opt, 2)
    params_continued = live_params(model)
    convert_own(folder, ws, rank)
    dist.barrier()  # every rank's files converted (a rank may read its neighbour's)

    fresh, fopt = build(kind, seed=1)
    init_optimizer_state(fopt)
    before = live_params(fresh)
    n = names(ws, rank)
    results[f"{kind_label}: model load_into"] = _returned_clean(
        zckpt.load_into(os.path.join(folder, n["model"] + ".zckpt"), fresh))
    results[f"{kind_label}: optimizer load_into"] = _returned_clean(
        zckpt.load_into(os.path.join(folder, n["optim"] + ".zckpt"), fopt))
    now = live_params(fresh)
    results[f"{kind_label}: fresh model differed before the load"] = (
        None if diff(before, saved_params, "x") else "the fresh model already equals the saved one: the test cannot fail")
    results[f"{kind_label}: live parameters equal the saved run's"] = diff(now, saved_params, "parameters")
    results[f"{kind_label}: optimizer moments equal the saved run's"] = diff(live_optim(fopt), saved_optim, "optimizer state")
    loss_resumed = step(fresh, fopt, 2)
    results[f"{kind_label}: next step's loss equals the continued run's"] = (
        None if loss_resumed == loss_continued else f"{loss_resumed!r} != {loss_continued!r}")
    results[f"{kind_label}: parameters after the next step equal"] = diff(live_params(fresh), params_continued, "after step")
    return saved_params, saved_optim, loss_continued


def verl_load_patched(kind, folder, ws, rank, saved, results):
    """FSDPCheckpointManager.load_checkpoint (lines 215-257) unchanged, its torch.load calls
    redirected by zckpt.patch_torch_load to the .zckpt files beside the .pt files."""
    import zckpt

    saved_params, saved_optim, loss_continued = saved
    model, opt = build(kind, seed=2)
    redirected = []
    n = names(ws, rank)
    with zckpt.torch_load_from_zckpt(log=lambda pt, z: redirected.append(os.path.basename(z))):
        with state_ctx(model):
            model.load_state_dict(torch.load(os.path.join(folder, n["model"] + ".pt"), weights_only=False))
            opt.load_state_dict(torch.load(os.path.join(folder, n["optim"] + ".pt"), weights_only=False))
        torch.load(os.path.join(folder, n["extra_state"] + ".pt"), weights_only=False)
    label = f"{kind}: verl load_checkpoint through patch_torch_load"
    want = sorted(v + ".zckpt" for v in n.values())
    results[label + " read the containers"] = None if sorted(redirected) == want else f"redirected {redirected}"
    results[label + " restores the parameters"] = diff(live_params(model), saved_params, "parameters")
    results[label + " restores the optimizer"] = diff(live_optim(opt), saved_optim, "optimizer state")
    loss = step(model, opt, 2)
    results[label + " gives the same next loss"] = None if loss == loss_continued else f"{loss!r} != {loss_continued!r}"


def _returned_clean(r):
    return None if r == ([], []) else f"returned {r}"


def join_group(rank, ws, port):
    """A spawned rank joins the gloo group; one thread (bit-exact comparisons of two runs), FSDP's
    warnings off."""
    import warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def worker(rank, ws, port, root, other_root, queue):
    report(rank, ws, port, queue, lambda results: run_cases(rank, ws, root, other_root, results))


def report(rank, ws, port, queue, cases):
    """Joins the group, runs cases(results), puts (rank, results) on the queue whatever happens
    (an exception as results["worker raised"]), leaves the group."""
    results = {}
    try:
        join_group(rank, ws, port)
        cases(results)
    except Exception:  # noqa: BLE001 - reported to the test
        results["worker raised"] = traceback.format_exc()
    finally:
        queue.put((rank, results))
        if dist.is_initialized():
            dist.destroy_process_group()


def run_cases(rank, ws, root, other_root, results):
    import zckpt

    for kind in ("fsdp1", "fsdp1_orig", "fsdp2"):
        saved = resume_case(kind, os.path.join(root, kind), ws, rank, results)
        if ws > 1 and kind != "fsdp1_orig":
            verl_load_patched(kind, os.path.join(root, kind), ws, rank, saved, results)
    if ws > 1:
        resume_case("fsdp1 FULL_STATE_DICT", os.path.join(root, "fsdp1_full"), ws, rank, results, full=True)

    n = names(ws, rank)
    # Refusals: a file of the other rank (same world size, same shapes for FSDP2/optimizers).
    if ws > 1:
        other = names(ws, 1 - rank)
        for kind in ("fsdp1", "fsdp2"):
            model, opt = build(kind, seed=3)
            init_optimizer_state(opt)
            path = os.path.join(root, kind, other["model"] + ".zckpt")
            results[f"{kind}: another rank's model file refused"] = expect_refusal(
                lambda: zckpt.load_into(path, model), path, f"saved by rank {1 - rank}")
            path = os.path.join(root, kind, other["optim"] + ".zckpt")
            results[f"{kind}: another rank's optimizer file refused"] = expect_refusal(
                lambda: zckpt.load_into(path, opt), path, f"saved by rank {1 - rank}")
        # FSDP1 at this world size with a neighbour's file missing: FSDP's own load, still right.
        alone = os.path.join(root, f"alone{rank}")
        os.makedirs(alone, exist_ok=True)
        shutil.copy(os.path.join(root, "fsdp1", n["model"] + ".zckpt"), alone)
        model, _ = build("fsdp1", seed=4)
        with warnings_caught() as caught:
            r = zckpt.load_into(os.path.join(alone, n["model"] + ".zckpt"), model)
        results["fsdp1: a missing neighbour file falls back to FSDP's load_state_dict"] = (
            None if r == ([], []) and any("not in place" in str(w.message) for w in caught) else f"{r}, {caught}")
        ref, _ = build("fsdp1", seed=0)
        saved = zckpt.load(os.path.join(root, "fsdp1", n["model"] + ".zckpt"), weights_only=False)
        with state_ctx(ref):
            ref.load_state_dict(saved)
        results["fsdp1: fallback restores the live parameters"] = diff(live_params(model), live_params(ref), "fallback")
    # Other world size: the files of the other run (FSDP2: mesh/placement; FSDP1: shard rows).
    if other_root:
        other_ws = 2 if ws == 1 else 1
        on = names(other_ws, 0)
        for kind in ("fsdp1", "fsdp2"):
            model, _ = build(kind, seed=5)
            src = os.path.join(other_root, kind, on["model"] + ".zckpt")
            results[f"{kind}: world size {other_ws} file refused at world size {ws}"] = expect_refusal(
                lambda: zckpt.load_into(src, model), src)
            # Renamed (no verl-style name to go by): the shard metadata alone must refuse it.
            renamed = os.path.join(root, f"renamed_{kind}_{rank}.zckpt")
            shutil.copy(src, renamed)
            if not (kind == "fsdp1" and other_ws == 1):  # a world-size-1 FSDP1 file is a full state dict
                results[f"{kind}: world size {other_ws} file under another name refused"] = expect_refusal(
                    lambda: zckpt.load_into(renamed, model), renamed, "resharding is not supported")
    # Wrong shapes: a model of another width refuses the file before writing anything.
    for kind in ("fsdp1", "fsdp2"):
        model, _ = build(kind, seed=6, dim=DIM + 2)
        path = os.path.join(root, kind, n["model"] + ".zckpt")
        before = live_params(model)
        results[f"{kind}: wrong shapes refused"] = expect_refusal(lambda: zckpt.load_into(path, model), path)
        results[f"{kind}: wrong shapes left the model untouched"] = diff(live_params(model), before, "untouched")


class warnings_caught:
    """Records every warning raised inside (the worker ignores warnings elsewhere)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings(record=True)
        caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return caught

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def run(ws, root, other_root=None, timeout=240):
    """Spawns `ws` ranks; returns {rank: {check: None or problem}}."""
    return spawn(worker, ws, (root, other_root), timeout)


def spawn(target, ws, args, timeout=240):
    """Runs target(rank, ws, port, *args, queue) in `ws` spawned ranks, each putting (rank,
    results) on the queue; returns {rank: results} of the ranks that reported in time."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, ws, port) + tuple(args) + (queue,)) for r in range(ws)]
    for p in procs:
        p.start()
    out = {}
    import time

    deadline = time.monotonic() + timeout
    while len(out) < ws and time.monotonic() < deadline:
        if not queue.empty():
            rank, results = queue.get()
            out[rank] = results
        elif not any(p.is_alive() for p in procs) and queue.empty():
            break
        else:
            time.sleep(0.05)
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    return out
