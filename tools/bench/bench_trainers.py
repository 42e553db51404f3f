#!/usr/bin/env python3
"""Trainers' checkpoints with their default I/O against zckpt plugged in, in one run (issue 46).

For each framework, a model of --params-m million fp32 parameters (Linear(--width, --width)
layers, Adam: parameters plus two moments, 1.1 GiB at the default 100 M) is trained one step on
the CPU and checkpointed through the framework's own call, then resumed in a new process through
its own resume call; contenders:

  lightning     default: Lightning's TorchCheckpointIO (torch.save, no fsync)
                zckpt: Trainer(plugins=[zckpt.lightning.ZckptCheckpointIO()])
                zckpt-async: ZckptCheckpointIO(async_save=True) (blocked: until the snapshot)
                save: trainer.save_checkpoint(path) after fit (what ModelCheckpoint calls);
                resume: fit(ckpt_path=path) until the first training batch starts
  transformers  default: the Trainer's own (model.safetensors, torch.save of optimizer.pt etc.)
                zckpt: zckpt.transformers.use_zckpt(trainer)
                zckpt-async: use_zckpt(trainer, async_save=True) (blocked: until the snapshot)
                save: the checkpoint-1 folder written inside train() (save_steps=1), timed from
                on_step_end to on_save; resume: train(resume_from_checkpoint=folder) until the
                first step begins
  verl          default: verl's FSDPCheckpointManager (torch.save of each rank's model_, optim_,
                extra_state_ files; FSDP1 over one gloo rank, a Llama of about --params-m M)
                zckpt: zckpt.verl.use_zckpt()
                save: manager.save_checkpoint(folder, global_step=1) after one step;
                resume: a fresh model and optimizer, manager.load_checkpoint(folder)

Each checkpoint is resumed twice: as its save left it (the default's files still in the page
cache, zckpt's dropped from it as they reached the disk: src/common/atomic_file.h), then cold,
every file of it evicted first (POSIX_FADV_DONTNEED), as after a restart on another node.
Measured per run, each in a fresh process (the framework's cached virtualenv,
~/.cache/zckpt/frameworks/<name>, seeing the build's zckpt as tools/ci/frameworks.sh does):
blocked seconds (save) or seconds to the first step (resume); the host memory the step added
(VmHWM after it minus VmRSS before it, the peak reset through /proc/self/clear_refs); the
process's whole peak RSS (wait4). Contenders interleaved over --rounds rounds (a shuffled order
each), every checkpoint fsynced and removed between runs outside the timing; medians, and the
ratio zckpt / default. The default I/O does not fsync (its save returns with the bytes in the
page cache); zckpt's save returns with them on disk.

Usage: python tools/bench/bench_trainers.py [--frameworks lightning,transformers,verl] [--rounds 3]
       [--params-m 100] [--build build] [--dir DIR] [--json]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from contenders import evict, host_memory, reset_peak  # noqa: E402
GIB = 1 << 30
# Million parameters of the benchmark's model: with Adam's two moments, >= 1 GiB (issue 46).
DEFAULT_PARAMS_M = 100
# The width of each square Linear layer: large tensors (64 MiB each), as a transformer's.
DEFAULT_WIDTH = 4096
CONTENDERS = {"lightning": ["default", "zckpt", "zckpt-async"], "transformers": ["default", "zckpt", "zckpt-async"],
              "verl": ["default", "zckpt"]}
# verl's model: Llama decoder layers of this hidden size (and 2.75x its MLP), as many as make
# --params-m million parameters; a small vocabulary, so that the layers hold nearly all of them.
VERL_HIDDEN = 2048
VERL_VOCAB = 1024
FRAMEWORKS_CACHE = os.environ.get("ZCKPT_FRAMEWORKS_CACHE", os.path.expanduser("~/.cache/zckpt/frameworks"))


# ---------------------------------------------------------------- child side (one process)


class Meter:
    """Times one step of the framework and the memory it adds."""

    def start(self):
        reset_peak()
        self.before = host_memory()["VmRSS"]
        self.t0 = time.perf_counter()

    def stop(self):
        seconds = time.perf_counter() - self.t0
        return {"seconds": seconds, "added": host_memory()["VmHWM"] - self.before}


def wide_model(params_m, width):
    import torch

    layers = max(1, round(params_m * 1e6 / (width * width + width)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def tree_files(path):
    """The file `path`, or every file under the folder `path`."""
    return [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]


def fsync_tree(path):
    """Every file under `path` (or the file `path`) fsynced."""
    for name in tree_files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def with_fsync(result, path):
    """`result` of a save plus the seconds an fsync of what it wrote then takes ("fsync"): what a
    save that does not fsync leaves to be written before the checkpoint survives a crash."""
    t0 = time.perf_counter()
    fsync_tree(path)
    result["fsync"] = time.perf_counter() - t0
    return result


def report_and_exit(result):
    """Prints the run's figures and ends the process at once (the rest of the resumed training is
    not measured)."""
    print(json.dumps(result), flush=True)
    os._exit(0)


def lightning_child(contender, phase, ckpt, params_m, width):
    import lightning.pytorch as pl
    import torch

    from zckpt.lightning import ZckptCheckpointIO

    meter = Meter()

    class Wide(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = wide_model(params_m, width)

        def training_step(self, batch, _):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    class FirstBatch(pl.Callback):
        def on_train_batch_start(self, *args):
            if phase == "resume":
                report_and_exit(meter.stop())

    data = torch.utils.data.TensorDataset(torch.randn(4, width))
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    plugins = {"default": [], "zckpt": [ZckptCheckpointIO()], "zckpt-async": [ZckptCheckpointIO(async_save=True)]}
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1 if phase == "save" else 2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         plugins=plugins[contender], callbacks=[FirstBatch()])
    model = Wide()
    if phase == "save":
        trainer.fit(model, loader)
        meter.start()
        trainer.save_checkpoint(ckpt)
        result = meter.stop()
        trainer.strategy.checkpoint_io.teardown()  # an async write finishes (outside the timing)
        report_and_exit(with_fsync(result, ckpt))
    meter.start()
    trainer.fit(model, loader, ckpt_path=ckpt)
    raise SystemExit("the resumed fit ended before its first batch")


def transformers_child(contender, phase, ckpt, params_m, width):
    import torch
    import transformers

    from zckpt.transformers import use_zckpt

    meter = Meter()

    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = wide_model(params_m, width)

        def forward(self, x, labels=None):
            return {"loss": (self.net(x) - labels).pow(2).mean()}

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if phase == "resume":
                report_and_exit(meter.stop())

        def on_step_end(self, args, state, control, **kwargs):
            meter.start()  # the checkpoint of this step follows

        def on_save(self, args, state, control, **kwargs):
            result = meter.stop()
            if contender == "zckpt-async":
                trainer._zckpt_writes.finish()  # the background write ends (outside the timing)
            report_and_exit(with_fsync(result, os.path.join(ckpt, "checkpoint-1")))

    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(width, generator=g), "labels": torch.randn(width, generator=g)} for _ in range(4)]
    args = transformers.TrainingArguments(
        output_dir=ckpt, max_steps=1 if phase == "save" else 2, per_device_train_batch_size=1,
        save_strategy="steps", save_steps=1, learning_rate=1e-4, use_cpu=True, report_to=[], logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False, label_names=["labels"])
    trainer = transformers.Trainer(model=Wide(), args=args, train_dataset=data, callbacks=[Timing()])
    if contender != "default":
        use_zckpt(trainer, async_save=contender == "zckpt-async")
    if phase == "save":
        trainer.train()
        raise SystemExit("train ended without saving")
    meter.start()
    trainer.train(resume_from_checkpoint=os.path.join(ckpt, "checkpoint-1"))
    raise SystemExit("the resumed train ended before its first step")


def verl_llama(params_m):
    """A Llama of about `params_m` million parameters (VERL_HIDDEN wide), built from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, intermediate = VERL_HIDDEN, VERL_HIDDEN * 11 // 4
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate
    layers = max(1, round((params_m * 1e6 - 2 * VERL_VOCAB * hidden) / per_layer))
    config = LlamaConfig(vocab_size=VERL_VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                         max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def verl_child(contender, phase, ckpt, params_m, width):
    """verl's FSDPCheckpointManager on FSDP1 over one gloo rank (the resume of test_verl.py's
    worker, at benchmark size)."""
    import socket

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from omegaconf import OmegaConf
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    if contender == "zckpt":
        import zckpt.verl

        zckpt.verl.use_zckpt()
    torch.manual_seed(0 if phase == "save" else 1)
    model = FSDP(verl_llama(params_m), auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                 device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    config = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                               "load_contents": ["model", "optimizer", "extra"]})
    manager = FSDPCheckpointManager(model, opt, sched, checkpoint_config=config)
    meter = Meter()
    if phase == "save":
        idx = torch.randint(0, VERL_VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
        logits = model(input_ids=idx[:, :-1]).logits
        F.cross_entropy(logits.reshape(-1, VERL_VOCAB), idx[:, 1:].reshape(-1)).backward()
        opt.step()
        sched.step()
        meter.start()
        manager.save_checkpoint(ckpt, global_step=1)
        report_and_exit(with_fsync(meter.stop(), ckpt))
    meter.start()
    manager.load_checkpoint(ckpt)
    report_and_exit(meter.stop())


CHILDREN = {"lightning": lightning_child, "transformers": transformers_child, "verl": verl_child}


# ---------------------------------------------------------------- parent side


def run_child(framework, contender, phase, ckpt, args):
    """One measuring process in the framework's virtualenv: its figures plus its whole peak RSS."""
    python = os.path.join(FRAMEWORKS_CACHE, framework, "bin", "python")
    build = os.path.realpath(args.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "src", "python"), ZCKPT_BIN=os.path.join(build, "tools", "zckpt"),
               ZCKPT_BUILD_ROOT=build, PYTHONWARNINGS="ignore")
    cmd = [python, os.path.abspath(__file__), "--child", f"{framework}:{contender}:{phase}", "--ckpt", ckpt,
           "--params-m", str(args.params_m), "--width", str(args.width)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode != 0 or not stdout.strip():
        raise SystemExit(f"{framework} {contender} {phase} failed ({p.returncode}):\n{stdout}\n{stderr[-4000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def settle(path):
    """The run's checkpoint durable and gone, and the disk given a moment, outside the timing."""
    if os.path.isdir(path):
        fsync_tree(path)
        shutil.rmtree(path)
    elif os.path.exists(path):
        fsync_tree(path)
        os.remove(path)
    os.sync()
    time.sleep(1)


def evict_tree(path):
    """Every file of the checkpoint out of the page cache (fsynced first: only clean pages go), as
    after a restart on another node or once memory pressure took them."""
    fsync_tree(path)
    for name in tree_files(path):
        evict(name, "fadvise")


def checkpoint_bytes(path):
    return sum(os.path.getsize(name) for name in tree_files(path))


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frameworks", default=",".join(CONTENDERS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--params-m", type=float, default=DEFAULT_PARAMS_M)
    ap.add_argument("--width", type=int, default=DEFAULT_WIDTH)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default=None, help="working folder (default: a new temporary folder, removed after)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        framework, contender, phase = args.child.split(":")
        return CHILDREN[framework](contender, phase, args.ckpt, args.params_m, args.width)

    work = args.dir or tempfile.mkdtemp(prefix="zckpt-bench-trainers-")
    os.makedirs(work, exist_ok=True)
    runs = {}
    rng = random.Random(46)
    try:
        for r in range(args.rounds):
            for framework in args.frameworks.split(","):
                order = CONTENDERS[framework][:]
                rng.shuffle(order)
                for contender in order:
                    ckpt = os.path.join(work, f"{framework}-{contender}" + (".ckpt" if framework == "lightning" else ""))
                    save = run_child(framework, contender, "save", ckpt, args)
                    size = checkpoint_bytes(ckpt)
                    fsync_tree(ckpt)  # the resume reads a settled checkpoint
                    os.sync()
                    resume = run_child(framework, contender, "resume", ckpt, args)
                    evict_tree(ckpt)
                    os.sync()
                    cold = run_child(framework, contender, "resume", ckpt, args)
                    settle(ckpt)
                    runs.setdefault(framework, {}).setdefault(contender, []).append(
                        {"save": save, "resume": resume, "cold": cold, "bytes": size})
                    print(f"round {r + 1}/{args.rounds} {framework} {contender}: save {save['seconds']:.2f} s "
                          f"(+ fsync {save['fsync']:.2f} s), resume {resume['seconds']:.2f} s, cold "
                          f"{cold['seconds']:.2f} s", file=sys.stderr)
        report(runs, args)
        if args.json:
            print(json.dumps(runs, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def report(runs, args):
    """The medians per framework and contender, ratios to the framework's default I/O. "durable":
    the save plus the fsync that makes what it wrote survive a crash (zckpt's save fsyncs itself,
    so its fsync after finds nothing left)."""
    print(f"model: {args.params_m:g} M fp32 parameters + Adam (Lightning, the Trainer: Linear {args.width}x{args.width} "
          f"layers; verl: a Llama); {args.rounds} rounds, contenders interleaved, each save and resume a fresh "
          "process; medians")
    print(f"{'framework':<13} {'contender':<12} {'ckpt GiB':>8} {'save s':>7} {'ratio':>6} {'durable s':>9} {'ratio':>6} "
          f"{'save +RSS':>10} {'resume s':>8} {'ratio':>6} {'cold s':>6} {'ratio':>6} {'resume +RSS':>11} "
          f"{'peak RSS save/resume':>21}")
    figures = {"save": lambda r: r["save"]["seconds"], "durable": lambda r: r["save"]["seconds"] + r["save"]["fsync"],
               "save_added": lambda r: r["save"]["added"], "save_peak": lambda r: r["save"]["peak_rss"],
               "resume": lambda r: r["resume"]["seconds"], "cold": lambda r: r["cold"]["seconds"],
               "resume_added": lambda r: r["resume"]["added"],
               "resume_peak": lambda r: r["resume"]["peak_rss"], "bytes": lambda r: r["bytes"]}
    for framework, by in runs.items():
        med = {c: {k: median([f(r) for r in rs]) for k, f in figures.items()} for c, rs in by.items()}
        base = med["default"]
        for c, m in med.items():
            print(f"{framework:<13} {c:<12} {m['bytes'] / GIB:>8.2f} {m['save']:>7.2f} {m['save'] / base['save']:>5.2f}x "
                  f"{m['durable']:>9.2f} {m['durable'] / base['durable']:>5.2f}x "
                  f"{m['save_added'] / GIB:>6.2f} GiB {m['resume']:>8.2f} {m['resume'] / base['resume']:>5.2f}x "
                  f"{m['cold']:>6.2f} {m['cold'] / base['cold']:>5.2f}x "
                  f"{m['resume_added'] / GIB:>7.2f} GiB {m['save_peak'] / GIB:>9.2f} / {m['resume_peak'] / GIB:.2f} GiB")


if __name__ == "__main__":
    main()
