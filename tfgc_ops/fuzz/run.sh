#!/usr/bin/env bash
# Builds the libFuzzer targets for the TF-free C++ cores in tfgc_ops/cc/ and runs each.
#
# usage: tfgc_ops/fuzz/run.sh [SECONDS] [OUT_DIR]
#   SECONDS  time per target (default 60)
#   OUT_DIR  binaries, corpora, crash artifacts and logs (default /tmp/tfgc-fuzz); must be
#            outside the repository
# environment:
#   JOBS=N        targets run N at a time (default 1)
#   MAX_LEN=N     libFuzzer -max_len (default 4096)
#   TARGETS="..." subset of targets (default: all sixteen)
#   CXX=...       compiler (default clang++-14 if present, else clang++)
#   BUILD_ONLY=1  build and stop
#   CC_DIR=...    directory holding the cores (zero_run.cc, quartic_rans.cc, ...) and headers
#                 (default tfgc_ops/cc; e.g. a mutated copy, to check that a target fails)
# Exits non-zero if a build fails or any target finds a crash.
set -euo pipefail

SECONDS_PER_TARGET="${1:-60}"
OUT="${2:-/tmp/tfgc-fuzz}"
JOBS="${JOBS:-1}"
MAX_LEN="${MAX_LEN:-4096}"
TARGETS="${TARGETS:-fuzz_zero_run_decode fuzz_zero_run_encode fuzz_unpack_keys fuzz_pack_keys fuzz_bit_packing fuzz_quartic_rans fuzz_quartic_fold fuzz_stochastic_rounding fuzz_log_levels fuzz_log_levels_encode fuzz_sign_bits fuzz_magnitude_filter fuzz_uniform_quantize fuzz_magnitude_select fuzz_row_sums fuzz_chunk_top_k}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CC_DIR="${CC_DIR:-$REPO/tfgc_ops/cc}"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
case "$OUT/" in
  "$REPO"/*) echo "run.sh: OUT_DIR $OUT is inside the repository; use a path outside it" >&2
             exit 2 ;;
esac

if [[ -z "${CXX:-}" ]]; then
  if command -v clang++-14 >/dev/null; then CXX=clang++-14; else CXX=clang++; fi
fi
CXXFLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
          -std=c++17 -I "$CC_DIR" -I "$HERE")

core_of() {
  case "$1" in
    fuzz_zero_run_*) echo "$CC_DIR/zero_run.cc $CC_DIR/zero_run_x86.cc" ;;
    fuzz_*keys) echo "$CC_DIR/key_packing.cc" ;;
    fuzz_bit_packing) echo "$CC_DIR/bit_packing.cc $CC_DIR/cpu_isa.cc" ;;
    fuzz_quartic_rans) echo "$CC_DIR/quartic_rans.cc" ;;
    fuzz_quartic_fold) echo "$CC_DIR/quartic_fold.cc" ;;
    fuzz_stochastic_rounding) echo "$CC_DIR/stochastic_rounding.cc $CC_DIR/bit_packing.cc $CC_DIR/cpu_isa.cc" ;;
    fuzz_log_levels*) echo "$CC_DIR/log_levels.cc $CC_DIR/bit_packing.cc $CC_DIR/cpu_isa.cc" ;;
    fuzz_sign_bits) echo "$CC_DIR/sign_bits.cc" ;;
    fuzz_magnitude_filter) echo "$CC_DIR/magnitude_filter.cc" ;;
    fuzz_uniform_quantize) echo "$CC_DIR/uniform_quantize.cc" ;;
    fuzz_magnitude_select) echo "$CC_DIR/magnitude_select.cc $CC_DIR/cpu_isa.cc" ;;
    fuzz_row_sums) echo "$CC_DIR/row_sums.cc" ;;
    fuzz_chunk_top_k) echo "$CC_DIR/chunk_top_k.cc $CC_DIR/magnitude_select.cc $CC_DIR/cpu_isa.cc" ;;
    *) echo "run.sh: unknown target $1" >&2; return 1 ;;
  esac
}

mkdir -p "$OUT/bin" "$OUT/logs"
echo "compiler: $("$CXX" --version | head -1)"
for t in $TARGETS; do
  echo "building $t"
  read -r -a cores <<<"$(core_of "$t")"
  extra=()
  # The selection's sampled path starts at 2^20 values: lowered here to inputs' sizes.
  [[ "$t" == fuzz_magnitude_select || "$t" == fuzz_chunk_top_k ]] && \
    extra=(-DTFGC_SELECT_BRACKET_MIN_VALUES=128 -DTFGC_SELECT_SAMPLE_SIZE=64)
  "$CXX" "${CXXFLAGS[@]}" "${extra[@]}" "$HERE/$t.cc" "${cores[@]}" -o "$OUT/bin/$t"
done
[[ "${BUILD_ONLY:-0}" == 1 ]] && exit 0

fuzz_command() {
  local t="$1"
  echo "$OUT/bin/$t" -max_total_time="$SECONDS_PER_TARGET" -max_len="$MAX_LEN" -timeout=30 \
    -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/" "$OUT/corpus/$t"
}

run_target() {
  local t="$1"
  mkdir -p "$OUT/corpus/$t" "$OUT/artifacts/$t"
  local cmd
  read -r -a cmd <<<"$(fuzz_command "$t")"
  local rc=0
  "${cmd[@]}" > "$OUT/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" > "$OUT/logs/$t.rc"
}

touch "$OUT/logs/.start"
echo "running: ${SECONDS_PER_TARGET}s per target, $JOBS at a time, output in $OUT"
running=0
for t in $TARGETS; do
  echo "  $(fuzz_command "$t")"
  run_target "$t" &
  running=$((running + 1))
  if (( running >= JOBS )); then wait -n || true; running=$((running - 1)); fi
done
wait || true

status=0
echo
printf '%-22s %6s %12s %8s %6s %6s %8s %8s\n' target rc execs exec/s cov ft corpus crashes
for t in $TARGETS; do
  log="$OUT/logs/$t.log"
  rc="$(cat "$OUT/logs/$t.rc" 2>/dev/null || echo '?')"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  eps="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  last="$(grep -E '^#[0-9]+' "$log" | grep ' cov: ' | tail -1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corpus="$(find "$OUT/corpus/$t" -type f | wc -l)"
  crashes="$(find "$OUT/artifacts/$t" -type f -newer "$OUT/logs/.start" \( -name 'crash-*' -o -name 'leak-*' \
              -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)"
  printf '%-22s %6s %12s %8s %6s %6s %8s %8s\n' "$t" "$rc" "${execs:-?}" "${eps:-?}" \
    "${cov:-?}" "${ft:-?}" "$corpus" "$crashes"
  if [[ "$rc" != 0 || "$crashes" != 0 ]]; then
    status=1
    echo "    FAILED: see $log and $OUT/artifacts/$t/" >&2
  fi
done
exit "$status"
