#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a while.
#
#   tools/ci/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     # default 60 s, every target
#
# Targets (tests/fuzz/): fuzz_container (the .zckpt reader), fuzz_pickle (the restricted
# unpickler, torch.save interpretation, legacy format), fuzz_pt_archive (zip reader and torch's
# archive layout), fuzz_convert (ConvertFile + ExportFile end to end). Seed corpora are made at
# run time from real files: small torch.save files (tests/fuzz/make_seeds.py, needs the project's
# torch), the data.pkl pickles inside them, and .zckpt containers converted from them by the
# built `zckpt convert` (raw, 4 KiB chunks, zstd). Each target's corpus grows across runs under
# the work folder. Prints per target: executions, coverage (cov/ft of libFuzzer's last status
# line), and every crash artifact; exits 1 when a target crashed (or failed to run).
#
# Environment:
#   ZCKPT_FUZZ_BUILD  build folder (default /tmp/zckpt-fuzz-build)
#   ZCKPT_FUZZ_WORK   seeds, corpora, artifacts, logs (default /tmp/zckpt-fuzz)
#   ZCKPT_VENV        the project's virtualenv (default ~/.cache/zckpt/venv)
#   ZCKPT_JOBS        build jobs (default 2)
#   ZCKPT_FUZZ_ARGS   extra libFuzzer flags
#   ZCKPT_FUZZ_TORCH  -Dtorch= of a new build folder (default disabled: the targets need no torch;
#                     tools/ci/hardening-ci.sh passes auto, its ASan+UBSan suites include the loader's)
# A crash replays with: $ZCKPT_FUZZ_BUILD/tests/fuzz/TARGET ARTIFACT
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
SECONDS_PER_TARGET=${1:-60}
shift $(( $# > 0 ? 1 : 0 ))
ALL_TARGETS=(fuzz_container fuzz_pickle fuzz_pt_archive fuzz_convert)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL_TARGETS[@]}")
BUILD=${ZCKPT_FUZZ_BUILD:-/tmp/zckpt-fuzz-build}
WORK=${ZCKPT_FUZZ_WORK:-/tmp/zckpt-fuzz}
VENV=${ZCKPT_VENV:-$HOME/.cache/zckpt/venv}
JOBS=${ZCKPT_JOBS:-2}
TORCH=${ZCKPT_FUZZ_TORCH:-disabled}

mkdir -p "$WORK"
log() { printf '[fuzz] %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }

for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || die "unknown target '$t' (known: ${ALL_TARGETS[*]})"
done
command -v clang++ >/dev/null || die "clang++ not found (apt-get install clang libclang-rt-14-dev)"

# --- build -------------------------------------------------------------------------------------
bash "$SRC/tools/build/check-build-dir.sh" "$BUILD" "$SRC" || die "build folder $BUILD is not this checkout's"
if [ ! -f "$BUILD/build.ninja" ]; then
  log "configuring $BUILD (-Dtorch=$TORCH)"
  CC=clang CXX=clang++ meson setup "$BUILD" -Dfuzz=enabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Dtorch="$TORCH" -Dpython_module=disabled -Dbuildtype=debugoptimized -Dcpp_args=-fsanitize=fuzzer-no-link \
    -Dpython="$VENV/bin/python" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log" >&2; die "meson setup failed"; }
fi
log "building ${TARGETS[*]} and zckpt"
ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]/#/tests/fuzz/}" tools/zckpt >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; die "build failed"; }

# --- seeds -------------------------------------------------------------------------------------
mkdir -p "$WORK/seeds"
SEEDS=$WORK/seeds
if [ ! -f "$SEEDS/.done" ]; then
  if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    log "writing seed files with torch"
    rm -rf "$SEEDS" && mkdir -p "$SEEDS/zckpt"
    "$VENV/bin/python" "$SRC/tests/fuzz/make_seeds.py" "$SEEDS" >&2 || die "make_seeds.py failed"
    for pt in "$SEEDS"/pt/*.pt; do
      name=$(basename "$pt" .pt)
      "$BUILD/tools/zckpt" convert --quiet "$pt" -o "$SEEDS/zckpt/$name.zckpt" >&2 || die "zckpt convert $pt failed"
      "$BUILD/tools/zckpt" convert --quiet --chunk-bytes 4096 "$pt" -o "$SEEDS/zckpt/$name.c4k.zckpt" >&2 || die "convert failed"
      "$BUILD/tools/zckpt" convert --quiet --chunk-bytes 4096 --zstd 3 "$pt" -o "$SEEDS/zckpt/$name.zstd.zckpt" >&2 || die "convert failed"
    done
    touch "$SEEDS/.done"
  else
    log "no torch in $VENV: fuzzing from the committed regression inputs only"
    mkdir -p "$SEEDS/pt" "$SEEDS/pickle" "$SEEDS/zckpt"
  fi
fi

seed_dirs() {
  case $1 in
    fuzz_container) echo "$SEEDS/zckpt" ;;
    fuzz_pickle) echo "$SEEDS/pickle" ;;
    fuzz_pt_archive|fuzz_convert) echo "$SEEDS/pt" ;;
  esac
  [ -d "$SRC/tests/fuzz/regressions/$1" ] && echo "$SRC/tests/fuzz/regressions/$1"
}

# --- run ---------------------------------------------------------------------------------------
status=0
summary=()
for t in "${TARGETS[@]}"; do
  corpus=$WORK/corpus/$t
  artifacts=$WORK/artifacts/$t
  logf=$WORK/logs/$t.log
  mkdir -p "$corpus" "$artifacts" "$WORK/logs"
  dict=()
  if [ "$t" = fuzz_convert ]; then  # a .pt holds both: zip records and a pickle
    cat "$SRC/tests/fuzz/fuzz_pt_archive.dict" "$SRC/tests/fuzz/fuzz_pickle.dict" >"$WORK/fuzz_convert.dict"
    dict=(-dict="$WORK/fuzz_convert.dict")
  elif [ -f "$SRC/tests/fuzz/$t.dict" ]; then
    dict=(-dict="$SRC/tests/fuzz/$t.dict")
  fi
  # Inputs up to a few times the largest seed (libFuzzer's default is the largest seed).
  case $t in
    fuzz_pickle) max_len=8192 ;;
    *) max_len=20000 ;;
  esac
  before=$(ls "$artifacts" 2>/dev/null | sort)
  mapfile -t seeds < <(seed_dirs "$t")
  log "$t: ${SECONDS_PER_TARGET} s (corpus $corpus, log $logf)"
  # shellcheck disable=SC2086
  ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
    "$BUILD/tests/fuzz/$t" "$corpus" "${seeds[@]}" "${dict[@]}" \
      -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -max_len="$max_len" \
      -artifact_prefix="$artifacts/" ${ZCKPT_FUZZ_ARGS:-} >"$logf" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logf" | tail -1 | grep -o '[0-9]*$')
  status_line=$(grep -E '^#[0-9]+.*cov: [0-9]+' "$logf" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$status_line" | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' <<<"$status_line" | grep -o '[0-9]*')
  corpus_n=$(grep -o 'corp: [0-9]*' <<<"$status_line" | grep -o '[0-9]*')
  after=$(ls "$artifacts" 2>/dev/null | sort)
  new=$(comm -13 <(echo "$before") <(echo "$after") | grep -v '^$' || true)
  crashes=$(grep -c . <<<"$new")
  line="$t: ${execs:-?} executions, cov ${cov:-?} ft ${ft:-?}, corpus ${corpus_n:-?} inputs, $crashes crash(es)"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    status=1
    line+=" [exit $rc]"
    for a in $new; do line+=$'\n'"    artifact: $artifacts/$a"; done
    [ -z "$new" ] && line+=$'\n'"    see $logf"
    grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer|LeakSanitizer)|runtime error|fuzz invariant broken' "$logf" \
      | sed 's/^/    /' >&2 || true
  fi
  summary+=("$line")
done

echo "fuzz summary (${SECONDS_PER_TARGET} s per target):"
for l in "${summary[@]}"; do echo "  $l"; done
exit $status
