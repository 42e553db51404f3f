"""Worker side of test_deepspeed.py (not a test module): gloo ranks running DeepSpeed's own engine
(deepspeed.initialize, DS_ACCELERATOR=cpu) on a small MLP with torch's AdamW, for each CONFIGS
entry (ZeRO stage 0, 1, 2 and 3 in fp32, ZeRO 2 in bf16).

Phases (each rank writes ROOT/<phase>_rank<R>.json: check name -> None or the problem):
  save:    train STEPS_SAVED steps from seed 0 (each rank its own batches); save_checkpoint with
           DeepSpeed's default engine into ROOT/<config>/pt, then zckpt.deepspeed.use_zckpt(engine)
           and save_checkpoint of the same state into ROOT/<config>/z; keep the live state
           (saved_rank<R>.pt) and the losses and state of STEPS_AFTER more steps
           (continued_rank<R>.pt).
  resume:  in new processes, an engine from seed 1 with use_zckpt() plugged in, load_checkpoint
           of the zckpt save and of the default save: the live state equals the saved one, and
           STEPS_AFTER more steps give the same losses and state, bit for bit.
  corrupt: use_zckpt(), load_checkpoint of ROOT/<config>/bad (one byte flipped in rank
           BAD_RANK's optimizer file, or in the model file at stage 0): records what each rank
           raised.
"""
import json
import os
import sys
import traceback

import torch

from gloo_ranks import differs  # this folder: sys.path[0] of the script

STEPS_SAVED, STEPS_AFTER = 3, 3
TAG = "step3"
BAD_RANK = 1
# name -> (ZeRO stage, bf16). DeepSpeed's CPU accelerator has no fp16.
CONFIGS = {"zero0": (0, False), "zero1": (1, False), "zero2": (2, False), "zero2_bf16": (2, True), "zero3": (3, False)}
BATCH, WIDTH = 4, 16


def ckpt_dir(root, config, kind):
    return os.path.join(root, config, kind)


def engine_for(config, seed):
    import deepspeed

    stage, bf16 = CONFIGS[config]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "bf16": {"enabled": bf16}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def train(engine, first_step, steps, rank):
    losses = []
    dtype = next(engine.module.parameters()).dtype
    for s in range(first_step, first_step + steps):
        g = torch.Generator().manual_seed(1000 * s + rank)  # each rank its own batch, each step its own
        x, y = torch.randn(BATCH, WIDTH, generator=g).to(dtype), torch.randn(BATCH, 1, generator=g).to(dtype)
        loss = ((engine(x) - y) ** 2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().float().item())
    return losses


def live(engine):
    """The module's parameters (under ZeRO 3 this rank's empty placeholders), the fp32 master
    partition ZeRO keeps and the torch optimizer's state tensors, cloned; the step count."""
    state = {"params": {k: v.detach().clone() for k, v in engine.module.named_parameters()},
             "global_steps": engine.global_steps}
    zero = engine.optimizer  # ZeRO 1 and 2, ZeRO 3: the fp32 master partition of each group
    parts = getattr(zero, "single_partition_of_fp32_groups", getattr(zero, "fp32_partitioned_groups_flat", []))
    for i, part in enumerate(parts):
        state[f"fp32_partition.{i}"] = part.detach().clone()
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    for i, p in enumerate(p for g in base.param_groups for p in g["params"]):
        for k, v in base.state[p].items():
            state[f"moments.{i}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return state


def save_phase(rank, root, results):
    import zckpt.deepspeed

    saved, continued = {}, {}
    for config in CONFIGS:
        engine = engine_for(config, seed=0)
        train(engine, 0, STEPS_SAVED, rank)
        engine.save_checkpoint(ckpt_dir(root, config, "pt"), tag=TAG)  # DeepSpeed's default engine
        zckpt.deepspeed.use_zckpt(engine)
        engine.save_checkpoint(ckpt_dir(root, config, "z"), tag=TAG)
        saved[config] = live(engine)
        losses = train(engine, STEPS_SAVED, STEPS_AFTER, rank)
        continued[config] = {"losses": losses, "state": live(engine)}
        results[f"{config}: saved"] = None
    torch.save(saved, os.path.join(root, f"saved_rank{rank}.pt"))
    torch.save(continued, os.path.join(root, f"continued_rank{rank}.pt"))


def resume_phase(rank, root, results):
    import zckpt.deepspeed

    saved = torch.load(os.path.join(root, f"saved_rank{rank}.pt"), weights_only=False)
    continued = torch.load(os.path.join(root, f"continued_rank{rank}.pt"), weights_only=False)
    for config in CONFIGS:
        for kind in ("z", "pt"):
            engine = zckpt.deepspeed.use_zckpt(engine_for(config, seed=1))
            path, _ = engine.load_checkpoint(ckpt_dir(root, config, kind), tag=TAG)
            results[f"{config} {kind}: loaded"] = None if path else "load_checkpoint found nothing"
            results[f"{config} {kind}: state after load"] = differs(saved[config], live(engine))
            losses = train(engine, STEPS_SAVED, STEPS_AFTER, rank)
            want = continued[config]
            results[f"{config} {kind}: losses"] = None if losses == want["losses"] else f"{losses} != {want['losses']}"
            results[f"{config} {kind}: state after training on"] = differs(want["state"], live(engine))


def corrupt_phase(rank, root, results):
    import zckpt.deepspeed

    config = sys.argv[6]
    engine = zckpt.deepspeed.use_zckpt(engine_for(config, seed=1))
    try:
        engine.load_checkpoint(ckpt_dir(root, config, "bad"), tag=TAG)
        results["raised"] = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        results["raised"] = {"class": type(e).__name__, "message": str(e)}


def main():
    rank, ws, port, phase, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(ws), LOCAL_RANK=str(rank), LOCAL_SIZE=str(ws),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    try:
        {"save": save_phase, "resume": resume_phase, "corrupt": corrupt_phase}[phase](rank, root, results)
    except Exception:  # noqa: BLE001 - reported to the test
        results["worker raised"] = traceback.format_exc()
    name = phase if phase != "corrupt" else f"corrupt_{sys.argv[6]}"
    with open(os.path.join(root, f"{name}_rank{rank}.json"), "w") as f:
        json.dump(results, f)
    os._exit(0)  # no gloo teardown: a rank whose peer failed would wait in it


if __name__ == "__main__":
    main()
