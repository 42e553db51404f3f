"""Worker side of test_verl.py (not a test module): gloo ranks running verl 0.9.1's own
FSDPCheckpointManager on a tiny Llama (built from a config, no download), FSDP1 and FSDP2.

Phases (each rank writes ROOT/<phase>_rank<R>.json: check name -> None or the problem):
  save:    train 2 steps from seed 0; save with verl's default I/O into ROOT/<strategy>/pt/...;
           then zckpt.verl.use_zckpt() and save the same state into ROOT/<strategy>/z/...; keep
           the live state (saved_rank<R>.pt) and what 2 more steps give (losses, parameters:
           continued_rank<R>.pt). FSDP1's rank 0 also keeps FSDP's full_optim_state_dict.
  resume:  in new processes, use_zckpt() first, a model and optimizer from seed 1, verl's
           load_checkpoint of the zckpt save and of the default save: the live state equals the
           saved one, and 2 more steps give the same losses and parameters, bit for bit.
  corrupt: use_zckpt(), load_checkpoint of ROOT/<strategy>/bad (one byte flipped in rank
           BAD_RANK's optimizer file): every rank raises, nothing trains on.
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "examples"))
from verl_real_check import build, step  # noqa: E402  (one tiny Llama and training step: the example's)

from gloo_ranks import differs  # noqa: E402  (this folder: sys.path[0] of the script)

STEPS_SAVED, STEPS_AFTER = 2, 2
STRATEGIES = ("fsdp", "fsdp2")
BAD_RANK = 1


def actor_dir(root, strategy, kind):
    return os.path.join(root, strategy, kind, "global_step_2", "actor")


def manager(model, opt, sched):
    from omegaconf import OmegaConf
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    cfg = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                            "load_contents": ["model", "optimizer", "extra"]})
    return FSDPCheckpointManager(model, opt, sched, checkpoint_config=cfg)


def live(model, opt):
    """The module's own parameters (FSDP1's FlatParameter shards, FSDP2's local shards) and the
    optimizer's own state tensors, cloned."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        params = {str(i): m._handle.flat_param.detach().clone() for i, m in enumerate(FSDP.fsdp_modules(model))
                  if m._handle}
    else:
        params = {k: v.to_local().detach().clone() for k, v in model.named_parameters()}
    moments = {}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            moments[f"{i}.{k}"] = (v.to_local() if hasattr(v, "to_local") else v).clone()
    return {"params": params, "moments": moments, "lr": [g["lr"] for g in opt.param_groups]}


def save_phase(rank, ws, root, results):
    import zckpt.verl

    trained = {}
    for strategy in STRATEGIES:
        model, opt, sched = build(strategy, 0)
        for n in range(STEPS_SAVED):
            step(model, opt, sched, n)
        manager(model, opt, sched).save_checkpoint(actor_dir(root, strategy, "pt"), global_step=STEPS_SAVED)
        trained[strategy] = (model, opt, sched)
    zckpt.verl.use_zckpt()
    for strategy, (model, opt, sched) in trained.items():
        folder = actor_dir(root, strategy, "z")
        manager(model, opt, sched).save_checkpoint(folder, global_step=STEPS_SAVED)
        torch.save(live(model, opt), os.path.join(root, strategy, f"saved_rank{rank}.pt"))
        if strategy == "fsdp":
            from torch.distributed.fsdp import FullStateDictConfig, FullOptimStateDictConfig, StateDictType
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                      FullOptimStateDictConfig(rank0_only=False)):
                full = FSDP.optim_state_dict(model, opt)
            if rank == 0:
                torch.save(full, os.path.join(root, strategy, "full_optim.pt"))
        losses = [step(model, opt, sched, STEPS_SAVED + n) for n in range(STEPS_AFTER)]
        torch.save({"losses": losses, "state": live(model, opt)}, os.path.join(root, strategy, f"continued_rank{rank}.pt"))
        dist.barrier()
        results[f"{strategy}: files"] = None


def resume_phase(rank, ws, root, results):
    import zckpt.verl

    zckpt.verl.use_zckpt()
    for strategy in STRATEGIES:
        saved = torch.load(os.path.join(root, strategy, f"saved_rank{rank}.pt"), weights_only=True)
        continued = torch.load(os.path.join(root, strategy, f"continued_rank{rank}.pt"), weights_only=True)
        for kind in ("z", "pt"):
            label = f"{strategy} {kind}"
            model, opt, sched = build(strategy, 1)
            calls = []
            real_load = torch.load
            torch.load = lambda *a, **k: calls.append(a[0]) or real_load(*a, **k)
            try:
                manager(model, opt, sched).load_checkpoint(actor_dir(root, strategy, kind))
            finally:
                torch.load = real_load
            # The zckpt save resumes without torch.load (load_into and zckpt.load); the default
            # save through verl's own three torch.load calls.
            want = 0 if kind == "z" else 3
            results[f"{label}: torch.load calls"] = None if len(calls) == want else f"{calls} (want {want})"
            results[f"{label}: live state after load_checkpoint"] = differs(live(model, opt), saved)
            losses = [step(model, opt, sched, STEPS_SAVED + n) for n in range(STEPS_AFTER)]
            results[f"{label}: losses after"] = None if losses == continued["losses"] else f"{losses} != {continued['losses']}"
            results[f"{label}: state after"] = differs(live(model, opt), continued["state"])


def corrupt_phase(rank, ws, root, results):
    import zckpt
    import zckpt.verl

    zckpt.verl.use_zckpt()
    for strategy in STRATEGIES:
        model, opt, sched = build(strategy, 1)
        try:
            manager(model, opt, sched).load_checkpoint(os.path.join(root, strategy, "bad"))
        except zckpt.ZckptError as e:
            results[f"{strategy}: raised"] = {"class": type(e).__name__, "message": str(e)}
            continue
        results[f"{strategy}: raised"] = None  # the test wants an error here


PHASES = {"save": save_phase, "resume": resume_phase, "corrupt": corrupt_phase}


def worker(rank, ws, port, phase, root):
    import warnings

    warnings.filterwarnings("ignore")
    results = {}
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ws),
                          LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
        torch.set_num_threads(1)
        PHASES[phase](rank, ws, root, results)
    except Exception:  # noqa: BLE001 - reported to the test
        results["worker raised"] = traceback.format_exc()[-4000:]
    finally:
        with open(os.path.join(root, f"{phase}_rank{rank}.json"), "w") as f:
            json.dump(results, f)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    rank_, ws_, port_, phase_, root_ = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    worker(rank_, ws_, port_, phase_, root_)
