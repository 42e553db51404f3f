"""Writes a torch.save file of about MB megabytes for the hardening suites.

Usage: make_pt.py OUT MB [SEED] [--legacy]

A state_dict-like dict of float32 tensors (4 MiB each, the last one smaller), a few small ones
and a nested optimizer-like entry; contents from SEED, so two SEEDs give different files.
"""
import sys

import torch


def main():
    out, mb = sys.argv[1], float(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else 0
    legacy = "--legacy" in sys.argv
    g = torch.Generator().manual_seed(seed)
    total = int(mb * (1 << 20))
    per = 4 << 20
    state = {}
    i = 0
    while total > 0:
        n = min(per, total) // 4
        if n == 0:
            break
        state[f"layers.{i}.weight"] = torch.randn(n, generator=g)
        total -= n * 4
        i += 1
    state["bias"] = torch.arange(10, dtype=torch.float32) + seed
    state["step"] = torch.tensor(seed)
    base = torch.arange(64, dtype=torch.float16).reshape(8, 8)
    obj = {"model": state, "view": base.t(), "base": base, "optim": {"lr": 0.1, "m": [torch.ones(3)]}}
    kwargs = {"_use_new_zipfile_serialization": False} if legacy else {}
    torch.save(obj, out, **kwargs)


if __name__ == "__main__":
    main()
