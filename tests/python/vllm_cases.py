"""The vLLM cases of test_vllm.py, run by the vLLM virtualenv's Python (tools/setup-vllm.sh) in
a subprocess each: `python vllm_cases.py CASE ARGS...`, printing one JSON line last.

  make DIR SEED [INTER]     a tiny random Llama saved by transformers (safetensors, 5 shards),
                            INTER its MLP width (default 128)
  generate DIR FORMAT       greedy token ids of PROMPTS from LLM(model=DIR, load_format=FORMAT)
  reload DIR UPDATE...      one engine from DIR (load format zckpt), then for each UPDATE a
                            reload_weights through collective_rpc and the outputs after it
"""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPTS = [[1, 5, 9, 33, 70], [2, 200, 17], [3, 3, 3, 3, 101, 250, 7]]
MAX_TOKENS = 12


def make(folder, seed, intermediate=128):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(int(seed))
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=int(intermediate), num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=False, torch_dtype="float32", bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)  # larger than init: outputs depend on every weight
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="100KB")
    return {"files": sorted(os.listdir(folder))}


def engine(folder, load_format, **kwargs):
    from vllm import LLM

    return LLM(model=folder, load_format=load_format, skip_tokenizer_init=True, dtype="float32", max_model_len=64,
               distributed_executor_backend="uni", enforce_eager=True, seed=0, **kwargs)


def outputs(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    res = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in res]


def generate(folder, load_format, extra=None):
    kwargs = {"model_loader_extra_config": json.loads(extra)} if extra else {}
    try:
        llm = engine(folder, load_format, **kwargs)
    except Exception as e:  # start-up refused: what the user sees
        return {"error": f"{type(e).__name__}: {e}", "chain": _chain(e)}
    return {"tokens": outputs(llm)}


def _chain(e):
    out = []
    while e is not None:
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return out


def reload(folder, *updates):
    import time

    llm = engine(folder, "zckpt")
    steps = [{"update": None, "tokens": outputs(llm)}]
    for u in updates:
        t0 = time.perf_counter()
        step = {"update": u}
        try:
            llm.collective_rpc("reload_weights", kwargs={"weights_path": u})
        except Exception as e:
            step["error"] = f"{type(e).__name__}: {e}"
            step["chain"] = _chain(e)
        step["seconds"] = time.perf_counter() - t0
        step["tokens"] = outputs(llm)
        steps.append(step)
    return {"steps": steps}


if __name__ == "__main__":  # the CPU build spawns workers: nothing may run on import
    case, args = sys.argv[1], sys.argv[2:]
    result = {"make": make, "generate": generate, "reload": reload}[case](*args)
    print("RESULT " + json.dumps(result))
