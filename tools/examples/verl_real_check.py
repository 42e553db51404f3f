"""verl 0.9.1's real FSDPCheckpointManager, unedited, resuming from zckpt containers.

Needs verl (PyPI `verl==0.9.1`; it pulls transformers, ray, peft, ...): install it into a
virtualenv of its own that sees the project's torch, not into the project's virtualenv, e.g.

    python3.11 -m venv /tmp/verl-venv
    echo ~/.cache/zckpt/venv/lib/python3.11/site-packages > /tmp/verl-venv/lib/python3.11/site-packages/zckpt-torch.pth
    /tmp/verl-venv/bin/pip install verl==0.9.1          # ~1 minute, ~1 GB; torch stays the project's
    PYTHONPATH=$PWD/build/src/python /tmp/verl-venv/bin/python tools/examples/verl_real_check.py

For each of verl's strategies (FSDP1 `FullyShardedDataParallel`, FSDP2 `fully_shard`) at
`--world-size` ranks (default 2, CPU/gloo) and a tiny Llama built from a config (no download):
train a few steps, FSDPCheckpointManager.save_checkpoint, run on one step; convert the folder
with zckpt; build a fresh model/optimizer (other seed); then
  a. `zckpt.patch_torch_load()` and FSDPCheckpointManager.load_checkpoint unchanged: every
     torch.load it makes reads the .zckpt beside the .pt;
  b. the in-place road: zckpt.load_into(model file, model) and (optimizer file, optimizer);
and check that the live parameters and optimizer moments equal the saved run's and the next
step's loss equals the uninterrupted run's. Prints one line per case and `verl real: OK`.
"""
import argparse
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from verl_resume import free_port, init_optimizer_state  # same folder


def build(strategy, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=67, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    return model, opt, sched


def step(model, opt, sched, n):
    g = torch.Generator().manual_seed(1000 + n + 17 * dist.get_rank())
    idx = torch.randint(0, 67, (2, 12), generator=g)
    logits = model(input_ids=idx[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, 67), idx[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def live(model, opt):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        params = {i: m._handle.flat_param.detach().clone() for i, m in enumerate(FSDP.fsdp_modules(model)) if m._handle}
    else:
        params = {k: v.to_local().detach().clone() for k, v in model.named_parameters()}
    moments = {}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            moments[(i, k)] = (v.to_local() if hasattr(v, "to_local") else v).clone()
    return params, moments


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def rank_main(rank, ws, port, root, queue):
    lines = []
    try:
        import warnings

        warnings.filterwarnings("ignore")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
        torch.set_num_threads(1)
        from omegaconf import OmegaConf
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

        import zckpt

        cfg = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                                "load_contents": ["model", "optimizer", "extra"]})
        for strategy in ("fsdp", "fsdp2"):
            model, opt, sched = build(strategy, 0)
            for n in range(2):
                step(model, opt, sched, n)
            pt_dir = os.path.join(root, strategy, "global_step_2", "actor")
            FSDPCheckpointManager(model, opt, sched, checkpoint_config=cfg).save_checkpoint(pt_dir, global_step=2)
            saved = live(model, opt)
            loss_continued = step(model, opt, sched, 2)
            if rank == 0:
                for name in sorted(os.listdir(pt_dir)):
                    if name.endswith(".pt"):
                        zckpt.convert(os.path.join(pt_dir, name), os.path.join(pt_dir, name[:-3] + ".zckpt"))
            dist.barrier()

            # a. verl's load_checkpoint unchanged; its torch.load calls read the containers.
            model, opt, sched = build(strategy, 1)
            read = []
            with zckpt.torch_load_from_zckpt(log=lambda pt, z: read.append(os.path.basename(z))):
                FSDPCheckpointManager(model, opt, sched, checkpoint_config=cfg).load_checkpoint(pt_dir)
            ok = len(read) == 3 and same(live(model, opt)[0], saved[0]) and same(live(model, opt)[1], saved[1])
            loss = step(model, opt, sched, 2)
            lines.append(f"{strategy} ws{ws} rank{rank} patched torch.load in FSDPCheckpointManager.load_checkpoint: "
                         f"read {len(read)} containers, live state {'equal' if ok else 'DIFFERS'}, next loss "
                         f"{'equal' if loss == loss_continued else f'{loss} != {loss_continued}'}")
            if not ok or loss != loss_continued:
                raise AssertionError(lines[-1])

            # b. in place.
            model, opt, sched = build(strategy, 1)
            init_optimizer_state(opt)
            stem = lambda k: os.path.join(pt_dir, f"{k}_world_size_{ws}_rank_{rank}.zckpt")  # noqa: E731
            zckpt.load_into(stem("model"), model)
            zckpt.load_into(stem("optim"), opt)
            extra = zckpt.load(stem("extra_state"), weights_only=False)
            sched.load_state_dict(extra["lr_scheduler"])
            ok = same(live(model, opt)[0], saved[0]) and same(live(model, opt)[1], saved[1])
            loss = step(model, opt, sched, 2)
            lines.append(f"{strategy} ws{ws} rank{rank} zckpt.load_into (model, optimizer): live state "
                         f"{'equal' if ok else 'DIFFERS'}, next loss "
                         f"{'equal' if loss == loss_continued else f'{loss} != {loss_continued}'}")
            if not ok or loss != loss_continued:
                raise AssertionError(lines[-1])
        queue.put((rank, True, lines))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put((rank, False, lines + [traceback.format_exc()]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="verl-real-") as root:
        procs = [ctx.Process(target=rank_main, args=(r, args.world_size, port, root, queue))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        for p in procs:
            p.join()
    good = True
    for rank, ok, lines in sorted(results):
        good &= ok
        for line in lines:
            print(line)
    print("verl real: OK" if good else "verl real: FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
