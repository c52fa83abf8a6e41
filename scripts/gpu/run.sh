#!/usr/bin/env bash
# One round of measurements on the GPU machine, over what scripts/gpu/stage.sh put in .gpu/.
# Run through the device tool from the project root: carry [".gpu"], command
#
#   bash scripts/gpu/run.sh STEP [STEP ...]
#
# Steps, in the order given:
#   smoke       SMOKE="EXECUTABLE FILTER" (e.g. "cuda_dpt implicit_conv"): that staged test
#               executable's tests whose names contain FILTER, 90 s at most; if they fail or hang,
#               no later step runs (a new kernel's hang then costs 90 s of the call, not all of it)
#   tests       every staged GPU test executable, with STREAMRECON_REQUIRE_GPU set: a test that
#               cannot use the GPU fails, and any other skip fails the step
#   e2e         bench e2e --frames 300, one frame a step; with a staged baseline the two builds
#               alternate, ROUNDS times each (default 2)
#   pairs       the same with --frames-per-step 2
#   392         the same at 518x392 (1042 tokens a frame), the product's 4:3 input
#   attention   bench attention (every kernel, the five cases, the split sweep)
#   anchors     the reference beside ours: its attention anchor and its end-to-end profiler
#               (FlashInfer + torch.compile, 172 frames); needs stage.sh --anchors
#   profile     Nsight Compute over one steady streaming frame (frame 30 of 40, one call in
#               flight, every kernel's duration), grouped by kernel family
#               (scripts/gpu/ncu_families.py); with a staged baseline, both builds and the
#               kernels whose time moved
#   detail      Nsight Compute sections (throughput, occupancy, pipes) of the GEMMs, frame-local
#               attention, LayerNorms, q/k/v split and camera-head sweeps of that frame
#               (scripts/gpu/ncu_detail.py)
#   stalls      Nsight Compute's full set (warp stall reasons, pipes) over the first launches of
#               the frame-local attention, the GEMMs, the residual LayerNorm, the q/k/v split, the
#               camera head's sweeps and the DPT im2col (scripts/gpu/ncu_stalls.py)
#   10k         bench e2e --frames 10000 (about 5.5 minutes: alone in a call)
# E2E_ARGS adds arguments to every bench e2e run (e.g. E2E_ARGS="--kernel ws-m256").
# VARIANT="NAME=VALUE" runs the new build a third time with that environment setting (e2e,
# pairs, attention, profile), and its camera-head, model and pair tests once more.
# A device call ends after 600 s: the tests take about 2 minutes, a bench e2e run under a
# minute, the anchors 4 to 5; each run here has its own timeout, so a hang costs one step.
#
# Everything goes to $OUT: logs.tar.gz (every log and JSON) and summary.txt, the table printed last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ $# -eq 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
  sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
OUT=${OUT:-/tmp/gpu-out}
logs=$OUT/logs
mkdir -p "$logs"
bin=/tmp/gpu-bin
mkdir -p "$bin"
export LD_LIBRARY_PATH=$PWD/.gpu/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Where a kernel had to be compiled at run time (no CUBIN for this GPU), once per call.
export STREAMRECON_KERNEL_CACHE=/tmp/streamrecon-kernels
ROUNDS=${ROUNDS:-2}
read -r -a e2e_extra <<<"${E2E_ARGS:-}"
failed=()

note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$logs/steps.log"; }

unpack() {
  [ -f .gpu/streamrecon.xz ] || { echo "run.sh: .gpu/streamrecon.xz missing: run scripts/gpu/stage.sh and carry [\".gpu\"]" >&2; exit 1; }
  xz -dc .gpu/streamrecon.xz >"$bin/streamrecon" && chmod +x "$bin/streamrecon"
  if [ -f .gpu/baseline.xz ]; then
    xz -dc .gpu/baseline.xz >"$bin/baseline" && chmod +x "$bin/baseline"
  fi
  cp .gpu/BUILD "$logs/BUILD" 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv \
    >"$logs/gpu.csv" 2>&1 || true
}

builds() {  # the staged builds, new first, then the new build with VARIANT's setting
  echo streamrecon
  [ -x "$bin/baseline" ] && echo baseline
  [ -n "${VARIANT:-}" ] && echo variant
}

build_cmd() {  # build: sets cmd to the command that runs it ("variant": the new one, VARIANT set)
  if [ "$1" = variant ]; then cmd=(env "$VARIANT" "$bin/streamrecon"); else cmd=("$bin/$1"); fi
}

tests_unpacked=0
unpack_tests() {  # the staged test executables into $bin/tests, once a run (a warm machine may
  # still hold an earlier call's)
  [ -f .gpu/tests.tar.xz ] || { note "tests: .gpu/tests.tar.xz missing (staged with --no-tests?)"; return 1; }
  [ "$tests_unpacked" = 1 ] && return 0
  rm -rf "$bin/tests" && mkdir -p "$bin/tests" && tar -C "$bin/tests" -xJf .gpu/tests.tar.xz || return 1
  tests_unpacked=1
}

step_smoke() {  # fails (and the run stops) unless SMOKE's tests pass
  local exe filter t rc
  read -r exe filter <<<"${SMOKE:-}"
  [ -n "$exe" ] && [ -n "$filter" ] || { note "smoke: SMOKE=\"EXECUTABLE FILTER\" not set"; failed+=(smoke); return 1; }
  unpack_tests || { failed+=(smoke); return 1; }
  t="$bin/tests/$exe"
  [ -x "$t" ] || { note "smoke: no staged test executable '$exe'"; failed+=(smoke); return 1; }
  note "smoke: $exe, tests matching '$filter'"
  STREAMRECON_FIXTURES=$PWD/.gpu/fixtures STREAMRECON_REQUIRE_FIXTURES=1 STREAMRECON_REQUIRE_GPU=1 \
    timeout 90 "$t" "$filter" --test-threads=1 --nocapture >"$logs/smoke-$exe.log" 2>&1
  rc=$?
  note "smoke $exe '$filter': rc $rc, $(grep -h '^test result' "$logs/smoke-$exe.log" | tail -1)"
  # A filter that matches nothing passes vacuously: that is a mistake in SMOKE, not a pass.
  if [ "$rc" = 0 ] && ! grep -q '^test result: ok\. [1-9]' "$logs/smoke-$exe.log"; then
    note "smoke: no test matched '$filter'"
    rc=1
  fi
  [ "$rc" = 0 ] || { failed+=("smoke:$exe"); return 1; }
}

step_tests() {
  unpack_tests || { failed+=(tests); return; }
  local t name rc ok=0 bad=0 skipped
  for t in "$bin/tests"/*; do
    name=$(basename "$t")
    STREAMRECON_FIXTURES=$PWD/.gpu/fixtures STREAMRECON_REQUIRE_FIXTURES=1 STREAMRECON_REQUIRE_GPU=1 \
      timeout 300 "$t" --test-threads=1 --nocapture >"$logs/test-$name.log" 2>&1
    rc=$?
    # --nocapture above: a passing test's "skipped: …" would otherwise be swallowed. Skips that
    # are expected on a machine with CUDA (the no-GPU paths) do not count.
    skipped=$(grep '^skipp' "$logs/test-$name.log" | grep -vc 'this machine has CUDA')
    if [ "$rc" = 0 ] && [ "$skipped" = 0 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); failed+=("test:$name"); fi
    note "test $name: rc $rc, $(grep -h '^test result' "$logs/test-$name.log" | tail -1), $skipped skipped"
  done
  note "tests: $ok executables passed, $bad failed"
  [ -n "${VARIANT:-}" ] || return 0
  for name in cuda_camera_head cuda_model cuda_pipeline_pairs; do
    t="$bin/tests/$name"
    [ -x "$t" ] || continue
    env "$VARIANT" STREAMRECON_FIXTURES=$PWD/.gpu/fixtures STREAMRECON_REQUIRE_FIXTURES=1 \
      STREAMRECON_REQUIRE_GPU=1 timeout 300 "$t" --test-threads=1 --nocapture \
      >"$logs/test-variant-$name.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || failed+=("test-variant:$name")
    note "test $name with $VARIANT: rc $rc, $(grep -h '^test result' "$logs/test-variant-$name.log" | tail -1)"
  done
}

e2e_runs() {  # label, extra bench e2e arguments...
  local label=$1 r b
  shift
  for ((r = 1; r <= ROUNDS; r++)); do
    for b in $(builds); do
      note "e2e $label $b round $r"
      build_cmd "$b"
      timeout 240 "${cmd[@]}" bench e2e --frames 300 "$@" "${e2e_extra[@]}" \
        --json "$logs/e2e-$label-$b-$r.json" >"$logs/e2e-$label-$b-$r.log" 2>&1 \
        || { note "e2e $label $b round $r failed (rc $?)"; failed+=("e2e-$label-$b"); }
    done
  done
}

step_attention() {
  local b
  for b in $(builds); do
    note "attention $b"
    build_cmd "$b"
    timeout 240 "${cmd[@]}" bench attention --json "$logs/attention-$b.json" >"$logs/attention-$b.log" 2>&1 \
      || { note "attention $b failed"; failed+=("attention-$b"); }
  done
}

step_anchors() {
  [ -d .gpu/anchor ] || { note "anchors: .gpu/anchor missing (stage.sh --anchors)"; failed+=(anchors); return; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/anchor/*.whl \
    >"$logs/anchor-pip.log" 2>&1
  note "attention anchor"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 300 python3 .gpu/anchor/attention_anchor.py \
    >"$logs/anchor-attention.jsonl" 2>"$logs/anchor-attention.err" || failed+=(anchor-attention)
  note "reference end to end (fi_compile, 172 frames)"
  OUT=$logs LINGBOT_E2E_CONFIGS=fi_compile LINGBOT_E2E_FRAMES=172 \
    bash .gpu/anchor/e2e/e2e_reference.sh >"$logs/anchor-e2e.jsonl" 2>"$logs/anchor-e2e.err" \
    || failed+=(anchor-e2e)
}

find_ncu() {
  local ncu candidate
  ncu=$(command -v ncu)
  for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -z "$ncu" ] && [ -x "$candidate" ] && ncu=$candidate
  done
  echo "$ncu"
}

step_profile() {
  local ncu b
  ncu=$(find_ncu)
  [ -n "$ncu" ] || { note "profile: ncu not found"; failed+=(profile); return; }
  for b in $(builds); do
    note "profile $b: $ncu over streaming frame 30 of 40"
    build_cmd "$b"
    # --log-file keeps ncu's CSV apart from the bench's own output.
    timeout 400 "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv \
      --print-units base --log-file "$logs/ncu-$b.csv" "${cmd[@]}" bench e2e --frames 40 \
      --in-flight 1 --profiler-frame 30 --profile-frames 0 "${e2e_extra[@]}" >"$logs/ncu-$b.log" 2>&1 \
      || { note "profile $b failed"; failed+=("profile:$b"); }
  done
  local base=()
  [ -s "$logs/ncu-baseline.csv" ] && base=("$logs/ncu-baseline.csv")
  python3 scripts/gpu/ncu_families.py "$logs/ncu-streamrecon.csv" "${base[@]}" \
    >"$logs/ncu-families.txt" 2>&1 || failed+=(profile-table)
  if [ -s "$logs/ncu-variant.csv" ]; then
    { echo; echo "With $VARIANT (against the new build without it):"; echo
      python3 scripts/gpu/ncu_families.py "$logs/ncu-variant.csv" "$logs/ncu-streamrecon.csv" \
        | sed -n '/^Against the baseline/,$p'; } >>"$logs/ncu-families.txt" 2>&1
  fi
}

# Nsight Compute's sections (speed of light, occupancy, launch, compute workload) for the kernels
# of one frame beside the global attention: what limits the GEMMs at 1005 rows, the frame-local
# attention, the LayerNorms and the q/k/v split. One replay pass per section and kernel: about
# 1.5 launches a second on an H100 (2026-12-07: 222 launches in 150 s), so the frame's 600-odd
# filtered launches do not all fit a call's 600 s. DETAIL_TIMEOUT (default 420 s) bounds it,
# and whatever was profiled until then is tabled (DINO's blocks come first, then the aggregator).
step_detail() {
  local ncu
  ncu=$(find_ncu)
  [ -n "$ncu" ] || { note "detail: ncu not found"; failed+=(detail); return; }
  note "detail: $ncu sections over streaming frame 30 of 40"
  timeout "${DETAIL_TIMEOUT:-420}" "$ncu" --profile-from-start off \
    --kernel-name 'regex:^(nvjet|paged_attention_fwd_sm90_ws$|paged_attention_fwd_sm90_ws_qkv|residual_layer_norm_1024|qkv_split|cam_sweep)' \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --csv --page details --print-units base \
    --log-file "$logs/ncu-detail.csv" "$bin/streamrecon" bench e2e --frames 40 --in-flight 1 \
    --profiler-frame 30 --profile-frames 0 "${e2e_extra[@]}" >"$logs/ncu-detail.log" 2>&1 \
    || { note "detail failed or timed out: the table holds the launches profiled until then"
         failed+=(detail); }
  [ -s "$logs/ncu-detail.csv" ] || return
  python3 scripts/gpu/ncu_detail.py "$logs/ncu-detail.csv" >"$logs/ncu-detail.txt" \
    2>"$logs/ncu-detail-metrics.txt" \
    || failed+=(detail-table)
}

# Nsight Compute's full set (warp stall reasons, pipes, memory) over the first launches of each
# family in streaming frame 30 of 40, one process a family (a frame's launches come in order:
# DINO first, the camera head last). About 15 s a family on an H100 (2026-12-07: the six in
# 90 s), most of it the bench's start.
step_stalls() {
  local ncu spec name count
  ncu=$(find_ncu)
  [ -n "$ncu" ] || { note "stalls: ncu not found"; failed+=(stalls); return; }
  for spec in paged_attention_fwd_sm90_ws_qkv:2 nvjet:4 residual_layer_norm_1024:2 \
    qkv_split_norm_rope:2 cam_sweep_k:4 dpt_im2col3x3:2; do
    name=${spec%%:*}
    count=${spec##*:}
    note "stalls: $name, $count launches"
    timeout 150 "$ncu" --profile-from-start off --kernel-name "regex:^$name" --launch-count "$count" \
      --set full --csv --page raw --print-units base --log-file "$logs/ncu-full-$name.csv" \
      "$bin/streamrecon" bench e2e --frames 40 --in-flight 1 --profiler-frame 30 --profile-frames 0 \
      "${e2e_extra[@]}" >"$logs/ncu-full-$name.log" 2>&1 || { note "stalls $name failed"; failed+=("stalls:$name"); }
  done
  python3 scripts/gpu/ncu_stalls.py "$logs"/ncu-full-*.csv >"$logs/ncu-stalls.txt" 2>&1 || failed+=(stalls-table)
}

unpack
for s in "$@"; do
  case "$s" in
    smoke) step_smoke || { note "smoke failed: the steps after it are not run"; break; } ;;
    tests) step_tests ;;
    e2e) e2e_runs one ;;
    pairs) e2e_runs pairs --frames-per-step 2 ;;
    392) e2e_runs 392 --resolution 518x392 ;;
    attention) step_attention ;;
    anchors) step_anchors ;;
    profile) step_profile ;;
    detail) step_detail ;;
    stalls) step_stalls ;;
    10k)
      note "e2e 10k"
      timeout 560 "$bin/streamrecon" bench e2e --frames 10000 --profile-frames 0 "${e2e_extra[@]}" \
        --json "$logs/e2e-10k.json" >"$logs/e2e-10k.log" 2>&1 || failed+=(10k)
      ;;
    *) note "unknown step '$s'"; failed+=("$s") ;;
  esac
done

python3 scripts/gpu/summary.py "$logs" >"$OUT/summary.txt" 2>&1
[ -f "$logs/ncu-families.txt" ] && cat "$logs/ncu-families.txt" >>"$OUT/summary.txt"
[ -f "$logs/ncu-detail.txt" ] && cat "$logs/ncu-detail.txt" >>"$OUT/summary.txt"
[ -f "$logs/ncu-stalls.txt" ] && cat "$logs/ncu-stalls.txt" >>"$OUT/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}" >>"$OUT/summary.txt"; fi
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$logs"
cat "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
