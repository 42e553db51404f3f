"""verl 0.9.1's real FSDPCheckpointManager across a `zckpt reshard`, and transformers'
from_pretrained under zckpt.patch_torch_load (issue 21's reproductions).

Needs verl and transformers in a virtualenv that sees the project's torch (see
verl_real_check.py's docstring), and the built `zckpt` binary:

    ZCKPT_BIN=$PWD/build/tools/zckpt PYTHONPATH=$PWD/build/src/python /work/venv-verl/bin/python \\
        tools/examples/verl_reshard_check.py

1. Two CPU/gloo ranks train a tiny Llama (verl_real_check.build) 3 steps with FSDP1 (verl's
   default `strategy: fsdp`) and FSDP2, FSDPCheckpointManager.save_checkpoint; rank 0 also keeps
   the full state torch gathers (FSDP1: FULL_STATE_DICT + FSDP.optim_state_dict; FSDP2:
   get_model_state_dict / get_optimizer_state_dict with full_state_dict=True).
2. `zckpt reshard ACTOR --world-size N -o OUT --format pt` for N in 4 and 1.
3. N ranks: FSDPCheckpointManager.load_checkpoint(OUT) unedited, against a fresh model loaded
   from the full state (FSDP1 through FULL_STATE_DICT and optim_state_dict_to_load); live
   FlatParameter shards / local shards, optimizer moments and the next step's loss must be
   equal. FSDP2: torch's get_optimizer_state_dict(full_state_dict=True) of the resumed optimizer
   must work and equal the original's.
4. `zckpt merge ACTOR --files optim` equals FSDP's full_optim_state_dict (FSDP1).
5. from_pretrained of a pytorch_model.bin folder whose config.json names no dtype: the same
   model with and without zckpt.patch_torch_load (which then reads the converted .zckpt).
Prints one line per check and `verl reshard: OK` (exit 0) or `verl reshard: FAILED`.
"""
import json
import os
import subprocess
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

from verl_real_check import build, live, same, step  # same folder
from verl_resume import free_port

STEPS = 3


def _cfg():
    from omegaconf import OmegaConf

    return OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                             "load_contents": ["model", "optimizer", "extra"]})


def _full(strategy, model, opt):
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullStateDictConfig, FullOptimStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                  FullOptimStateDictConfig(rank0_only=False)):
            return {k: v.clone() for k, v in model.state_dict().items()}, FSDP.optim_state_dict(model, opt)
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    o = StateDictOptions(full_state_dict=True)
    return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)


def _nested_equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_nested_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_nested_equal(x, y) for x, y in zip(a, b))
    return a == b


def _rank(rank, ws, port, root, phase, queue):
    lines, ok = [], True
    try:
        import warnings

        warnings.filterwarnings("ignore")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
        torch.set_num_threads(1)
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

        for strategy in ("fsdp", "fsdp2"):
            base = os.path.join(root, strategy)
            if phase == "save":
                model, opt, sched = build(strategy, 0)
                for n in range(STEPS):
                    step(model, opt, sched, n)
                FSDPCheckpointManager(model, opt, sched, checkpoint_config=_cfg()).save_checkpoint(
                    os.path.join(base, "actor"), global_step=STEPS)
                full = _full(strategy, model, opt)
                if rank == 0:
                    torch.save({"model": full[0], "optim": full[1], "sched": sched.state_dict()},
                               os.path.join(base, "full.pt"))
                dist.barrier()
                continue
            full = torch.load(os.path.join(base, "full.pt"), weights_only=False)
            model, opt, sched = build(strategy, 1)
            FSDPCheckpointManager(model, opt, sched, checkpoint_config=_cfg()).load_checkpoint(
                os.path.join(base, f"r{ws}"))
            tag = f"{strategy} 2 -> {ws} rank {rank}"
            if strategy == "fsdp":
                from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
                from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

                ref, ref_opt, ref_sched = build(strategy, 2)
                with FSDP.state_dict_type(ref, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                          FullOptimStateDictConfig(rank0_only=False)):
                    ref.load_state_dict(full["model"])
                    ref_opt.load_state_dict(FSDP.optim_state_dict_to_load(ref, ref_opt, full["optim"]))
                ref_sched.load_state_dict(full["sched"])
                a, b = live(model, opt), live(ref, ref_opt)
                good = same(a[0], b[0]) and same(a[1], b[1])
                loss, ref_loss = step(model, opt, sched, STEPS), step(ref, ref_opt, ref_sched, STEPS)
                lines.append(f"{tag}: verl load_checkpoint of the resharded files: live state "
                             f"{'equal' if good else 'DIFFERS'} to FSDP's full-state-dict resume, next loss "
                             f"{'equal' if loss == ref_loss else f'{loss} != {ref_loss}'}")
                ok &= good and loss == ref_loss
            else:
                osd = _full(strategy, model, opt)[1]
                good = _nested_equal(osd, full["optim"])
                lines.append(f"{tag}: verl load_checkpoint, then get_optimizer_state_dict(full_state_dict=True): "
                             f"{'equal to the original' if good else 'DIFFERS'}")
                ok &= good
    except Exception:  # noqa: BLE001 - reported by the parent
        ok = False
        lines.append(traceback.format_exc())
    finally:
        queue.put((rank, ok, lines))
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(ws, root, phase):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, ws, port, root, phase, queue)) for r in range(ws)]
    for p in procs:
        p.start()
    out = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return sorted(out)


def _zckpt(*args):
    r = subprocess.run([os.environ.get("ZCKPT_BIN", "zckpt"), *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"zckpt {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr}")
    return r.stdout


def _merge_check(root):
    import zckpt

    actor = os.path.join(root, "fsdp", "actor")
    out = os.path.join(root, "optim_merged.zckpt")
    _zckpt("merge", actor, "--files", "optim", "-o", out)
    full = torch.load(os.path.join(root, "fsdp", "full.pt"), weights_only=False)["optim"]["state"]
    want = {f"state.{fqn}.{k}": v for fqn, e in full.items() for k, v in e.items() if isinstance(v, torch.Tensor)}
    got = zckpt.load(out)
    good = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    return good, f"fsdp: zckpt merge --files optim {'equals' if good else 'DIFFERS from'} FSDP's full_optim_state_dict"


def _from_pretrained_check(root):
    """transformers loads pytorch_model.bin with map_location='meta' when config.json has no dtype."""
    import zckpt
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = os.path.join(root, "hf_bin")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=67, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    os.makedirs(folder)
    cfg.save_pretrained(folder)
    torch.save(LlamaForCausalLM(cfg).state_dict(), os.path.join(folder, "pytorch_model.bin"))
    config = json.load(open(os.path.join(folder, "config.json")))
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    plain = LlamaForCausalLM.from_pretrained(folder).state_dict()
    zckpt.convert(os.path.join(folder, "pytorch_model.bin"), os.path.join(folder, "pytorch_model.zckpt"))
    read = []
    with zckpt.torch_load_from_zckpt(log=lambda pt, z: read.append(z), strict=True):
        patched = LlamaForCausalLM.from_pretrained(folder).state_dict()
    good = bool(read) and same(plain, patched)
    return good, (f"from_pretrained of a pytorch_model.bin folder (no dtype in config.json) under patch_torch_load: "
                  f"read {len(read)} containers, state {'equal' if good else 'DIFFERS'} to without the patch")


def main():
    good = True
    with tempfile.TemporaryDirectory(prefix="verl-reshard-") as root:
        results = _spawn(2, root, "save")
        for ws in (4, 1):
            for strategy in ("fsdp", "fsdp2"):
                _zckpt("reshard", os.path.join(root, strategy, "actor"), "--world-size", ws, "-o",
                       os.path.join(root, strategy, f"r{ws}"), "--format", "pt")
            results += _spawn(ws, root, "resume")
        for rank, ok, lines in results:
            good &= ok
            for line in lines:
                print(line)
        for check in (_merge_check, _from_pretrained_check):
            ok, line = check(root)
            good &= ok
            print(line)
    print("verl reshard: OK" if good else "verl reshard: FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
