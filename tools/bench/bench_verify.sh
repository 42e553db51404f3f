#!/usr/bin/env bash
# Verify benchmark (issue: container format): a ~1 GiB shard written by torch, converted, then
# `zckpt bench verify` (verify vs sequential read vs single-core XXH3, same run), plus a real
# `cat FILE > /dev/null` timed by the shell for comparison.
#   tools/bench/bench_verify.sh [GiB] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
GIB=${1:-1}
WORK=${2:-${TMPDIR:-/tmp}/zckpt-bench-verify}
BUILD=${ZCKPT_BUILD:-build}
PY=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}/bin/python
ZCKPT=$BUILD/tools/zckpt
mkdir -p "$WORK"
"$PY" - "$WORK/shard.pt" "$GIB" <<'PYEOF'
import sys, torch
path, gib = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
sd, total, i = {}, 0, 0
while total < gib * 2**30:
    t = torch.randn(4096, 4096).to(torch.bfloat16 if i % 2 else torch.float32)
    sd[f"layers.{i}.weight"] = t
    total += t.numel() * t.element_size()
    i += 1
torch.save(sd, path)
print(f"wrote {path}: {total / 2**30:.2f} GiB in {len(sd)} tensors")
PYEOF
"$ZCKPT" convert "$WORK/shard.pt" -o "$WORK/shard.zckpt" --quiet --force
"$ZCKPT" bench verify "$WORK/shard.zckpt" --rounds 5
best=1e9
for _ in 1 2 3; do
  s=$(date +%s.%N); cat "$WORK/shard.zckpt" > /dev/null; e=$(date +%s.%N)
  best=$(python3 -c "print(min($best, $e - $s))")
done
python3 -c "import os; b=os.path.getsize('$WORK/shard.zckpt'); print(f'  cat FILE > /dev/null (shell)  {$best:8.3f} s {b/$best/1e9:7.2f} GB/s')"
