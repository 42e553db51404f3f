"""One Lightning run of tests/frameworks/test_lightning.py, in a process of its own (the resume must
be a new process; Lightning's DDP launcher runs this script again for each further rank):

    python lightning_worker.py CONFIG.json

CONFIG: package ("lightning.pytorch" or "pytorch_lightning"), io ("zckpt", "zckpt-async" or
"default": Lightning's own TorchCheckpointIO), epochs (max_epochs), ckpt_dir (ModelCheckpoint's
dirpath: top-k 2 by train_loss, last.ckpt a link), resume (ckpt_path for fit, or null), devices
(1, or 2 over gloo), strategy (with 2 devices: "ddp", the default; "fsdp", FSDPStrategy's
sharded checkpoints; "model_parallel", ModelParallelStrategy's, FSDP2 over the data-parallel
mesh; "model_parallel_full", the same writing full one-file checkpoints) and out: rank 0 writes there {"losses": [per step], "params": {name: list}} as JSON
(float.hex, so equal means bit-identical), or {"error": type, "message", "file", "chunk"} when
fit raised (exit 3). Optional: write_delay (seconds each rank's zckpt DCP container write waits
first, so that a background write is still in flight at the next save, removal and teardown),
blocked (a path under ckpt_dir made a directory before fit, where a rank's container is to be
written: that write fails; ModelCheckpoint then reuses names instead of adding -v1). Rank 0 also
reports "removed" (the folders removed, ModelCheckpoint's top-k) and "removed_before_whole" (those
removed while the newest saved folder had no meta.pt yet, i.e. while its write was in flight).
"""
import importlib
import json
import os
import shutil
import sys
import time

import torch

from gloo_ranks import finish, write_result  # this folder: sys.path[0] of the script

STEPS_PER_EPOCH = 4  # batches of BATCH rows per epoch (per rank under DDP: the data is split)
BATCH = 8
FEATURES = 16


def hexed(t):
    return [float(x).hex() for x in t.detach().flatten().tolist()]


def fsdp_on_the_cpu(pl):
    """FSDPStrategy(state_dict_type="sharded") as it runs on the CPU. Lightning refuses the class
    itself with accelerator="cpu" (its check names the exact class, not a subclass), and hands FSDP
    device_id=None, which FSDP refuses without an accelerator; so this subclass wraps the module
    with device_id=cpu first, and Lightning's _setup_model keeps a module wrapped already."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    class CpuFSDPStrategy(pl.strategies.FSDPStrategy):
        def _setup_model(self, model):
            model = FullyShardedDataParallel(model, device_id=torch.device("cpu"),
                                             sharding_strategy=self.sharding_strategy)
            return super()._setup_model(model)

    return CpuFSDPStrategy(state_dict_type="sharded")


def make_strategy(pl, name, devices):
    if devices == 1:
        return "auto"
    if name == "fsdp":
        return fsdp_on_the_cpu(pl)
    if name in ("model_parallel", "model_parallel_full"):
        return pl.strategies.ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1,
                                                   save_distributed_checkpoint=name == "model_parallel")
    return "ddp"


def full_params(trainer, model):
    """The module's parameters whole, on every rank (a collective under FSDP and FSDP2)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(trainer.strategy.model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(trainer.strategy.model):
            return {name: hexed(p) for name, p in model.net.state_dict().items()}
    return {name: hexed(p.full_tensor() if hasattr(p, "full_tensor") else p)
            for name, p in model.net.state_dict().items()}


def delay_container_writes(seconds):
    """Every zckpt DCP container write waits `seconds` first."""
    from zckpt.dcp import ZckptStorageWriter

    write_data = ZckptStorageWriter.write_data

    def delayed(self, plan, planner):
        time.sleep(seconds)
        return write_data(self, plan, planner)

    ZckptStorageWriter.write_data = delayed


def watch_removals(checkpoint):
    """{"removed": [...], "removed_before_whole": [...]}, filled as folders are removed (shutil.rmtree,
    ZckptCheckpointIO.remove_checkpoint's): each removed folder, and those removed while the folder
    `checkpoint` (ModelCheckpoint) saved last had no meta.pt."""
    seen = {"removed": [], "removed_before_whole": []}
    rmtree = shutil.rmtree

    def watched(path, *args, **kwargs):
        newest = checkpoint._last_checkpoint_saved
        seen["removed"].append(os.path.basename(path))
        if newest and not os.path.isfile(os.path.join(newest, "meta.pt")):
            seen["removed_before_whole"].append(os.path.basename(path))
        return rmtree(path, *args, **kwargs)

    shutil.rmtree = watched
    return seen


def main():
    config = json.load(open(sys.argv[1]))
    pl = importlib.import_module(config["package"])
    from zckpt.lightning import ZckptCheckpointIO

    devices = config.get("devices", 1)
    strategy = config.get("strategy", "ddp")

    class Tiny(pl.LightningModule):
        """A two-layer net with Adam and a step schedule, so that resuming needs the optimizer's
        moments, its step count and the scheduler's state, not just the weights."""

        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
            self.losses = []

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(float(loss.detach()).hex())
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=devices > 1)
            return loss

        def configure_model(self):
            if strategy.startswith("model_parallel"):
                from torch.distributed.fsdp import fully_shard

                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)]

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS_PER_EPOCH * BATCH * devices, FEATURES),
                                          torch.randn(STEPS_PER_EPOCH * BATCH * devices, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=False)
    torch.manual_seed(1)
    model = Tiny()
    plugins = {"zckpt": [ZckptCheckpointIO()], "zckpt-async": [ZckptCheckpointIO(async_save=True)],
               "default": []}[config["io"]]
    if config.get("write_delay"):
        delay_container_writes(config["write_delay"])
    if config.get("blocked"):
        os.makedirs(os.path.join(config["ckpt_dir"], config["blocked"]), exist_ok=True)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=config["ckpt_dir"], monitor="train_loss", save_top_k=2,
                                              save_last="link", every_n_epochs=1,
                                              enable_version_counter=not config.get("blocked"))
    removals = watch_removals(checkpoint)
    trainer = pl.Trainer(max_epochs=config["epochs"], accelerator="cpu", devices=devices,
                         strategy=make_strategy(pl, strategy, devices), plugins=plugins, callbacks=[checkpoint],
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True)
    try:
        trainer.fit(model, loader, ckpt_path=config.get("resume"))
    except Exception as e:  # what the test expects of a damaged file, reported by rank 0
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            write_result(config["out"], {"error": type(e).__name__, "message": str(e), "file": getattr(e, "file", None),
                                         "chunk": getattr(e, "chunk", None), "losses": model.losses})
        finish(3)
    params = full_params(trainer, model)
    if trainer.global_rank == 0:
        write_result(config["out"], {"losses": model.losses, "params": params, "global_step": trainer.global_step,
                                     **removals})
    finish(0)


if __name__ == "__main__":
    main()
