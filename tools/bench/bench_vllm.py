#!/usr/bin/env python3
"""vLLM benchmark: engine start-up and weight load with `--load-format zckpt` against vLLM's
default safetensors loader (and fastsafetensors, runai_streamer, instanttensor, tensorizer when
their packages are installed in the vLLM virtualenv, ZCKPT_VLLM_PEERS=1 tools/setup-vllm.sh; each
is reported as skipped otherwise, and as failed, with vLLM's error, when it does not run here), and
weight reload (reload_weights through collective_rpc) from a zckpt folder against a reload from
the safetensors folder.

Run with the vLLM virtualenv's Python (tools/setup-vllm.sh prints it):

  $(bash tools/setup-vllm.sh | tail -1) tools/bench/bench_vllm.py [--gib 1] [--rounds 3]
                                        [--workdir DIR] [--out results.json]

Writes a random Llama of about --gib GiB (float32) with transformers (safetensors shards), and a
second one (the update), converts both with `zckpt convert`, then over --rounds rounds in a
rotating order starts one engine per load format in a process of its own (skip_tokenizer_init,
the "uni" executor, VLLM_ENABLE_V1_MULTIPROCESSING=0) and reports medians of:

  contenders the default loader (safetensors, mapped), zckpt (mapped, every chunk checked in the
             mapping), zckpt with mmap=False (streamed into fresh tensors), the peers installed
  start      LLM(...) construction, wall seconds
  load       the load format's load_weights (read + vLLM's weight_loader copies)
  reload     collective_rpc("reload_weights", weights_path=UPDATE), the update's format the same as
             the engine's (zckpt: every chunk verified and the tensor table checked first)
  verify     of zckpt's reload, the part that checks the update before the first tensor
             (zckpt.iter_tensors(UPDATE, verify_first=True) returning), in this process

Every engine's greedy output after start-up must equal the default loader's (else the run stops).
The files stay in the page cache (read once before the rounds).
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = [1, 5, 9, 33, 70, 11, 12]
PEERS = {"fastsafetensors": "fastsafetensors", "runai_streamer": "runai_model_streamer",
         "instanttensor": "instanttensor", "tensorizer": "tensorizer"}


def make(folder, gib, seed):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, vocab = 1024, 2816, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, int((gib * (1 << 30) / 4 - 2 * vocab * hidden) // per_layer))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=16, head_dim=64, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).float()
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="500MB")


def engine_child(fmt, folder, update, extra="{}"):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.model_executor import model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    cls = model_loader._LOAD_FORMAT_TO_MODEL_LOADER[fmt]
    timed = {}
    original = cls.load_weights

    def load_weights(self, model, model_config):
        t0 = time.perf_counter()
        original(self, model, model_config)
        timed["load"] = time.perf_counter() - t0

    cls.load_weights = load_weights
    t0 = time.perf_counter()
    llm = LLM(model=folder, load_format=fmt, skip_tokenizer_init=True, dtype="float32", max_model_len=128,
              distributed_executor_backend="uni", enforce_eager=True, seed=0,
              model_loader_extra_config=json.loads(extra))
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    tokens = list(llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids)
    out = {"start": start, "load": timed.get("load"), "tokens": tokens}
    if update:
        t0 = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": update})
        out["reload"] = time.perf_counter() - t0
        out["tokens_after"] = list(llm.generate([{"prompt_token_ids": PROMPT}], params,
                                                use_tqdm=False)[0].outputs[0].token_ids)
    print("RESULT " + json.dumps(out))


def run_child(*args, fatal=True):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        errors = [x for x in (r.stdout + r.stderr).splitlines() if "Error" in x and not x.startswith(" ")]
        why = f"exit {r.returncode}: " + (errors[-1].strip()[:300] if errors else r.stderr.strip()[-300:])
        if fatal:
            raise SystemExit(f"{args}: {why}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        return {"error": why}
    return json.loads(lines[-1][7:])


def read_all(folder):
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(64 << 20):
                pass


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        if kind == "make":
            make(rest[0], float(rest[1]), int(rest[2]))
            print("RESULT {}")
        else:
            engine_child(*rest)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/zckpt-bench-vllm")
    p.add_argument("--zckpt", default="zckpt", help="the zckpt command (default: the one on PATH / in this venv)")
    p.add_argument("--out")
    a = p.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    zckpt_cmd = a.zckpt
    if zckpt_cmd == "zckpt" and os.path.exists(os.path.join(os.path.dirname(sys.executable), "zckpt")):
        zckpt_cmd = os.path.join(os.path.dirname(sys.executable), "zckpt")
    folders = {}
    for name, seed in (("a", 0), ("b", 1)):
        hf, conv = os.path.join(a.workdir, f"{name}-hf"), os.path.join(a.workdir, f"{name}-zckpt")
        if not os.path.exists(os.path.join(hf, "config.json")):
            run_child("make", hf, str(a.gib), str(seed))
        if not os.path.exists(os.path.join(conv, "config.json")):
            subprocess.run([zckpt_cmd, "convert", hf, "-o", conv + "/"], check=True, capture_output=True)
        folders[name] = (hf, conv)
        read_all(hf)
        read_all(conv)
    size = sum(os.path.getsize(os.path.join(folders["a"][0], f)) for f in os.listdir(folders["a"][0]))
    # label -> (load format, model_loader_extra_config)
    contenders = {"auto": ("auto", {}), "zckpt": ("zckpt", {}), "zckpt mmap=False": ("zckpt", {"mmap": False})}
    skipped = {}
    for fmt, module in PEERS.items():
        if importlib.util.find_spec(module) is None:
            skipped[fmt] = f"python package {module!r} not installed in {sys.prefix}"
        else:
            contenders[fmt] = (fmt, {})
    formats = list(contenders)
    results = {f: [] for f in formats}
    verify_s = []
    failed = {}
    for r in range(a.rounds):
        import zckpt

        t0 = time.perf_counter()
        zckpt.iter_tensors(folders["b"][1], verify_first=True)
        verify_s.append(time.perf_counter() - t0)
        order = formats[r % len(formats):] + formats[:r % len(formats)]
        for fmt in order:
            load_format, extra = contenders[fmt]
            which = 1 if load_format == "zckpt" else 0
            if fmt in failed:
                continue
            res = run_child("engine", load_format, folders["a"][which], folders["b"][which], json.dumps(extra),
                            fatal=fmt in ("auto", "zckpt"))
            if "error" in res:  # a peer that does not run on this build: said once, left out
                failed[fmt] = res["error"]
                print(f"round {r} {fmt}: failed: {res['error']}", flush=True)
                continue
            results[fmt].append(res)
            print(f"round {r} {fmt}: start {res['start']:.2f} s, load {res['load'] or float('nan'):.2f} s, "
                  f"reload {res['reload']:.2f} s", flush=True)
    ref = results["auto"][0]
    results = {f: rs for f, rs in results.items() if f not in failed}
    for fmt, rs in results.items():
        for res in rs:
            if res["tokens"] != ref["tokens"] or res["tokens_after"] != ref["tokens_after"]:
                raise SystemExit(f"{fmt}: outputs differ from the default loader's: {res} vs {ref}")
    import torch
    import vllm

    summary = {"model_bytes": size, "rounds": a.rounds, "vllm": vllm.__version__, "torch": torch.__version__,
               "cpus": os.cpu_count(), "skipped": skipped, "failed": failed, "formats": {}}
    print(f"\nmodel {size / (1 << 30):.2f} GiB float32, vLLM {vllm.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, medians of {a.rounds} rounds")
    print(f"{'format':<18}{'start s':>9}{'load s':>9}{'reload s':>10}{'load GB/s':>11}")
    for fmt, rs in results.items():
        med = {}
        for k in ("start", "load", "reload"):
            values = [x[k] for x in rs if x.get(k) is not None]
            med[k] = statistics.median(values) if values else float("nan")
        summary["formats"][fmt] = med
        print(f"{fmt:<18}{med['start']:9.2f}{med['load']:9.2f}{med['reload']:10.2f}{size / med['load'] / 1e9:11.2f}")
    for fmt, why in skipped.items():
        print(f"{fmt:<18}skipped: {why}")
    for fmt, why in failed.items():
        print(f"{fmt:<18}failed: {why}")
    summary["zckpt_reload_verify"] = statistics.median(verify_s)
    print(f"of zckpt's reload, verifying the update first: {summary['zckpt_reload_verify']:.2f} s "
          f"({size / summary['zckpt_reload_verify'] / 1e9:.2f} GB/s)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
