"""One accelerate training loop of tests/frameworks/test_accelerate.py, in a process of its own
(under torchrun for two ranks):

    python accelerate_worker.py CONFIG.json

CONFIG: io ("zckpt": the Accelerator passed through zckpt.accelerate.use_zckpt, or "default"),
save_dir (where save_state writes after SAVE_AT steps; the run then stops), resume (a folder for
load_state before training, or null) and out: rank 0 writes there {"losses": [per step],
"params": {name: list}} as JSON (float.hex, so equal means bit-identical), or {"error": type,
"message", "file", "chunk", "losses"} when load_state raised (exit 3).
"""
import json
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

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


def main():
    config = json.load(open(sys.argv[1]))
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
        except Exception as e:  # what the test expects of a damaged file, reported by rank 0
            if accelerator.is_main_process:
                json.dump({"error": type(e).__name__, "message": str(e), "file": getattr(e, "file", None),
                           "chunk": getattr(e, "chunk", None), "losses": losses}, open(config["out"], "w"))
            sys.exit(3)
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
        json.dump({"losses": losses, "params": params, "global_step": progress.step}, open(config["out"], "w"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
