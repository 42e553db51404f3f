"""One accelerate training loop of tests/frameworks/test_accelerate.py, in a process of its own
(under torchrun for two ranks):

    python accelerate_worker.py CONFIG.json

CONFIG: io ("zckpt": the Accelerator passed through zckpt.accelerate.use_zckpt, or "default"),
save_dir (where save_state writes after SAVE_AT steps; the run then stops), resume (a folder for
load_state before training, or null) and out: rank 0 writes there {"losses": [per step],
"params": {name: list}} as JSON (float.hex, so equal means bit-identical), or {"error": type,
"message", "file", "chunk", "losses"} when load_state raised (exit 3).

With "fsdp": 2 in CONFIG the run is fsdp_main's instead (two ranks): accelerate's FSDP checkpoint
functions called directly, since accelerate runs no FSDP on the CPU (test_accelerate.py says why).
"""
import contextlib
import json
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

from gloo_ranks import finish, write_result  # this folder: sys.path[0] of the script

TOTAL_STEPS = 12
SAVE_AT = 6  # an epoch's end on one rank and on two (6 and 3 steps an epoch)
EXAMPLES = 24
BATCH = 4
FEATURES = 16


class Progress:
    """The loop's own counter, saved by save_state as a registered custom object."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def report_error(accelerator, config, e, losses):
    """What the test expects of a damaged file, reported by rank 0; every rank exits 3, once rank 0
    has written (torchrun stops the other ranks when one exits non-zero)."""
    if accelerator.is_main_process:
        write_result(config["out"], {"error": type(e).__name__, "message": str(e), "file": getattr(e, "file", None),
                                     "chunk": getattr(e, "chunk", None), "losses": losses})
    accelerator.wait_for_everyone()
    finish(3)


def main():
    config = json.load(open(sys.argv[1]))
    if config.get("fsdp"):
        return fsdp_main(config)
    from zckpt.accelerate import use_zckpt

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    if config["io"] == "zckpt":
        assert use_zckpt(accelerator) is accelerator
    set_seed(42)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(EXAMPLES, FEATURES, generator=g),
                                          torch.randn(EXAMPLES, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    # Dropout draws from the RNG whose state save_state keeps; AdamW and the schedule keep state too.
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Dropout(0.2), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    losses = []
    if config.get("resume"):
        try:
            accelerator.load_state(config["resume"])
        except Exception as e:
            report_error(accelerator, config, e, losses)
    epoch = progress.step // len(loader)
    while progress.step < TOTAL_STEPS:
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(float(loss.detach()).hex())
            progress.step += 1
            if progress.step == SAVE_AT and config.get("save_dir"):
                accelerator.save_state(config["save_dir"])
                break
        else:
            epoch += 1
            continue
        break
    if accelerator.is_main_process:
        params = {n: [float(v).hex() for v in p.detach().flatten().tolist()]
                  for n, p in accelerator.unwrap_model(model).state_dict().items()}
        write_result(config["out"], {"losses": losses, "params": params, "global_step": progress.step})
    accelerator.end_training()


# ----- FSDP2: accelerate's checkpoint component (accelerate.utils.fsdp_utils) driven directly -----

FSDP_TOTAL_STEPS = 8
FSDP_SAVE_AT = 4


def fsdp_model():
    """A tiny MLP, each Linear and the whole sharded over the ranks by FSDP2 (fully_shard on gloo)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def fsdp_batch(step, rank):
    """Step `step`'s batch on `rank`: the same in every run, different on each rank."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 1, generator=g)


def fsdp_io(io):
    """Where the direct calls run: zckpt.accelerate.fsdp_io(), the block save_state and load_state
    run in under use_zckpt, or accelerate's own I/O."""
    from zckpt.accelerate import fsdp_io as through_zckpt

    return through_zckpt() if io == "zckpt" else contextlib.nullcontext()


def full_params(model):
    """{name: float.hex list} of the whole (gathered) model, on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {n: [float(v).hex() for v in t.flatten().tolist()] for n, t in state.items()}


def fsdp_main(config):
    """FSDP2 under a MULTI_CPU Accelerator, SHARDED_STATE_DICT: trains FSDP_TOTAL_STEPS steps; at
    FSDP_SAVE_AT saves the model and optimizer to each [io, folder] of config["saves"] (the run goes
    on) or, with config["resume"] ([io, folder]), starts there after loading them."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == "MULTI_CPU" and accelerator.num_processes == 2
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    model = fsdp_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, step = [], 0
    if config.get("resume"):
        io, folder = config["resume"]
        try:
            with fsdp_io(io):
                load_fsdp_model(plugin, accelerator, model, folder)
                load_fsdp_optimizer(plugin, accelerator, opt, model, folder)
        except Exception as e:
            report_error(accelerator, config, e, losses)
        step = FSDP_SAVE_AT
    while step < FSDP_TOTAL_STEPS:
        x, y = fsdp_batch(step, accelerator.process_index)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()).hex())
        step += 1
        if step == FSDP_SAVE_AT:
            for io, folder in config.get("saves", []):
                with fsdp_io(io):
                    save_fsdp_model(plugin, accelerator, model, folder)
                    save_fsdp_optimizer(plugin, accelerator, opt, model, folder)
    params = full_params(model)
    if accelerator.is_main_process:
        write_result(config["out"], {"losses": losses, "params": params})
    accelerator.end_training()


if __name__ == "__main__":
    main()
    finish(0)
