"""One gloo rank of tests/frameworks/test_torchtitan.py (not a test module): torchtitan 0.3.0's own
CheckpointManager, unedited, driven directly (its trainer needs CUDA) over a small MLP sharded by
FSDP2 (fully_shard over the ranks on the CPU), torchtitan's OptimizersContainer (AdamW) and
LRSchedulersContainer (LambdaLR), and a train_state item.

`python torchtitan_worker.py RANK WORLD_SIZE PORT PHASE ROOT` (gloo_ranks.spawn); phases:
- save: trains STEPS_BEFORE steps, saves step-STEPS_BEFORE with torchtitan's default I/O under
  ROOT/default and, after zckpt.torchtitan.use_zckpt(), under ROOT/zckpt; trains STEPS_AFTER
  more and keeps the losses and the full parameters as the uninterrupted reference.
- resume: with zckpt plugged in, a model built from another seed loads each folder through
  CheckpointManager.load, trains STEPS_AFTER steps; checks the losses and parameters equal the
  reference bit for bit.
- corrupt: the load of ROOT/bad (a copy of the zckpt save with a flipped byte) must raise;
  reports the class, message, file and chunk.
Writes ROOT/<PHASE>_rank<RANK>.json: check name -> None or the problem (gloo_ranks.py)."""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gloo_ranks  # noqa: E402

STEPS_BEFORE = 3
STEPS_AFTER = 3
WIDTH = 32
BATCH = 8
# Folders under ROOT of each save (CheckpointManager.Config.folder).
FOLDERS = ("zckpt", "default")


class TrainState:
    """The trainer's step counter, saved as torchtitan saves its train_state (a Stateful)."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state):
        self.step = int(state["step"])


def build(ws, seed, root, folder):
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))
    if ws > 1:
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    optimizers = OptimizersContainer(
        OptimizersContainer.Config(implementation="for-loop", param_groups=[
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                             optimizer_kwargs={"lr": 1e-2, "weight_decay": 0.1})]),
        model_parts=[model])
    schedulers = LRSchedulersContainer(optimizers, lambda step: 1.0 / (1 + step))
    state = TrainState()
    manager = CheckpointManager(
        CheckpointManager.Config(enable=True, folder=folder, interval=1, keep_latest_k=0, last_save_model_only=False),
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=root)
    return model, optimizers, schedulers, state, manager


def train(model, optimizers, schedulers, state, steps, rank):
    losses = []
    for _ in range(steps):
        state.step += 1
        g = torch.Generator().manual_seed(1000 * state.step + rank)
        x = torch.randn(BATCH, WIDTH, generator=g)
        y = torch.randn(BATCH, 1, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        schedulers.step()
        losses.append(loss.item().hex())  # bit for bit
    return losses


def full_params(model):
    out = {}
    for name, p in model.named_parameters():
        p = p.detach()
        out[name] = p.full_tensor() if hasattr(p, "full_tensor") else p.clone()
    return out


def main(rank, ws, port, phase, root):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    import zckpt
    import zckpt.torchtitan

    results = {}
    if phase == "save":
        for folder in reversed(FOLDERS):  # the default save first, before zckpt is plugged in
            if folder == "zckpt":
                zckpt.torchtitan.use_zckpt()
            model, optimizers, schedulers, state, manager = build(ws, 0, root, folder)
            train(model, optimizers, schedulers, state, STEPS_BEFORE, rank)
            results[f"{folder}: saved"] = None if manager.save(STEPS_BEFORE) else "save returned False"
            manager.close()
            reference = {"losses": train(model, optimizers, schedulers, state, STEPS_AFTER, rank),
                         "params": full_params(model)}
            torch.save(reference, os.path.join(root, f"reference_{folder}_rank{rank}.pt"))
        a, b = (torch.load(os.path.join(root, f"reference_{f}_rank{rank}.pt")) for f in FOLDERS)
        # The save with either I/O leaves training as it was: both references are the same run.
        results["both runs alike"] = gloo_ranks.differs(a, b)
    elif phase == "resume":
        zckpt.torchtitan.use_zckpt()
        for folder in FOLDERS:
            model, optimizers, schedulers, state, manager = build(ws, 1, root, folder)
            fresh = full_params(model)
            results[f"{folder}: loaded"] = None if manager.load() else "load found no checkpoint"
            results[f"{folder}: step"] = None if state.step == STEPS_BEFORE else f"step {state.step}"
            unchanged = gloo_ranks.differs(fresh, full_params(model)) is None
            results[f"{folder}: load changed the parameters"] = "the fresh model's parameters" if unchanged else None
            losses = train(model, optimizers, schedulers, state, STEPS_AFTER, rank)
            reference = torch.load(os.path.join(root, f"reference_{folder}_rank{rank}.pt"))
            want = reference["losses"]
            results[f"{folder}: losses"] = None if losses == want else f"{losses} != {want}"
            results[f"{folder}: parameters"] = gloo_ranks.differs(full_params(model), reference["params"])
            manager.close()
    elif phase == "corrupt":
        zckpt.torchtitan.use_zckpt()
        model, optimizers, schedulers, state, manager = build(ws, 1, root, "bad")
        try:
            manager.load()
            results["raised"] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            results["raised"] = {"class": type(e).__name__, "message": str(e), "file": getattr(e, "file", None),
                                 "chunk": getattr(e, "chunk", None)}
        results["no step ran"] = None if state.step == 0 else f"step {state.step}"
    with open(os.path.join(root, f"{phase}_rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    rank, ws, port, phase, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    try:
        main(rank, ws, port, phase, root)
    except BaseException:  # noqa: BLE001 - the test shows it
        with open(os.path.join(root, f"{phase}_rank{rank}.json"), "w") as f:
            json.dump({"worker raised": traceback.format_exc()}, f)
        raise
