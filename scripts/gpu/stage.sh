#!/usr/bin/env bash
# Builds what a round of measurements on the GPU machine needs and stages it in .gpu/ (ignored by
# git), compressed so that it fits the device tool's 64 MiB travel limit:
#
#   .gpu/streamrecon.xz     the release binary of the working tree, stripped
#   .gpu/baseline.xz        (--baseline FILE) another build's binary, for A/B runs in one call
#   .gpu/tests.tar.xz       the GPU test executables (tests/cuda_*.rs), stripped
#   .gpu/stubs/             stand-in FFmpeg libraries (scripts/gpu-ffmpeg-stubs.sh): the GPU
#                           machine has no FFmpeg, and the binaries link it
#   .gpu/fixtures/          the parts of the gct-tiny fixtures the GPU tests read
#   .gpu/anchor/            (--anchors) the reference's timings (../shared/tools/anchor)
#   .gpu/BUILD              what was built: commit, dirty or not, sha256 of each binary
#
# Then, with the device tool: carry [".gpu"], command "bash scripts/gpu/run.sh STEP ...".
#
#   scripts/gpu/stage.sh [--anchors] [--baseline FILE] [--no-tests]
#
# FILE is an unstripped or stripped streamrecon binary built here earlier (keep a copy of
# target/release/streamrecon before changing the tree). Needs the CUDA toolchain of
# scripts/cuda-env.sh, so the kernels are embedded as CUBIN and nothing is compiled on the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

anchors=0
baseline=""
tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --anchors) anchors=1 ;;
    --baseline)
      [ $# -ge 2 ] || { echo "stage.sh: --baseline needs a file" >&2; exit 2; }
      baseline=$2
      shift
      ;;
    --no-tests) tests=0 ;;
    *) echo "stage.sh: unknown argument '$1' (expected --anchors, --baseline FILE, --no-tests)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$baseline" ] && [ ! -f "$baseline" ]; then
  echo "stage.sh: --baseline $baseline: no such file" >&2
  exit 2
fi
shared="$root/../shared"
if [ "$tests" = 1 ] && [ ! -d "$shared/fixtures/gct-tiny" ]; then
  echo "stage.sh: $shared/fixtures/gct-tiny not found: the GPU tests need the parity fixtures" >&2
  exit 1
fi

bash scripts/system-deps.sh
# shellcheck source=/dev/null
source scripts/cuda-env.sh
if ! command -v nvcc >/dev/null 2>&1; then
  echo "stage.sh: nvcc not found: without it the binary would compile its kernels on the device" >&2
  exit 1
fi
for tool in jq xz strip readelf; do
  command -v "$tool" >/dev/null 2>&1 || { echo "stage.sh: $tool not found (apt-get install jq xz-utils binutils)" >&2; exit 1; }
done
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tests"
if [ "$tests" = 1 ]; then
  test_args=()
  for f in tests/cuda_*.rs; do
    name=$(basename "$f" .rs)
    # Compile-only (every kernel through NVRTC): it runs in CI, not on the device.
    [ "$name" = cuda_nvrtc ] && continue
    test_args+=(--test "$name")
  done
  cargo test --release --locked --no-run "${test_args[@]}" --message-format=json >"$tmp/build.json"
  jq -r 'select(.reason == "compiler-artifact" and .executable != null and
                (.target.kind | index("test"))) | "\(.target.name) \(.executable)"' \
    "$tmp/build.json" | while read -r name exe; do
    strip -o "$tmp/tests/$name" "$exe"
  done
  count=$(find "$tmp/tests" -type f | wc -l)
  [ "$count" -gt 0 ] || { echo "stage.sh: no GPU test executables were built" >&2; exit 1; }
fi

# Built after the tests: their build links target/release/streamrecon again with the features of
# the tests' dependencies unified in, a different binary (the same code of ours). Staged is what
# `cargo build --release` gives a user, and target/ keeps it, to copy as a later --baseline.
# (Until 2026-12-05 the staged binary was the tests' variant: session 9's e2d3624b is one.)
cargo build --release --locked --bin streamrecon
strip -o "$tmp/streamrecon" target/release/streamrecon
elfs=("$tmp/streamrecon")
if [ -n "$baseline" ]; then
  strip -o "$tmp/baseline" "$baseline"
  elfs+=("$tmp/baseline")
fi

[ "$tests" = 1 ] && elfs+=("$tmp/tests"/*)

rm -rf .gpu/streamrecon.xz .gpu/baseline.xz .gpu/tests.tar.xz .gpu/stubs .gpu/fixtures .gpu/anchor
mkdir -p .gpu
xz -T2 -6 -c "$tmp/streamrecon" >.gpu/streamrecon.xz
[ -n "$baseline" ] && xz -T2 -6 -c "$tmp/baseline" >.gpu/baseline.xz
if [ "$tests" = 1 ]; then
  tar -C "$tmp/tests" -cf - . | xz -T2 -6 >.gpu/tests.tar.xz
fi
bash scripts/gpu-ffmpeg-stubs.sh .gpu/stubs "${elfs[@]}" >/dev/null
if [ "$tests" = 1 ]; then
  # What the GPU tests read: the weights and each scenario's config and images (they compare
  # against our CPU model, not the reference's outputs; a missing file fails them by name).
  mkdir -p .gpu/fixtures
  (cd "$shared/fixtures/gct-tiny" &&
    cp --parents weights.safetensors derived.safetensors kf*/config.json kf*/inputs.safetensors \
      "$root/.gpu/fixtures/")
  chmod -R u+w .gpu/fixtures
fi
if [ "$anchors" = 1 ]; then
  cp -r "$shared/tools/anchor" .gpu/anchor
  chmod -R u+w .gpu/anchor
fi

{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "streamrecon $(sha256sum "$tmp/streamrecon" | cut -c1-16)"
  [ -n "$baseline" ] && echo "baseline $(sha256sum "$tmp/baseline" | cut -c1-16) ($baseline)"
  if [ "$tests" = 1 ]; then
    for t in "$tmp/tests"/*; do echo "test $(basename "$t") $(sha256sum "$t" | cut -c1-16)"; done
  fi
} >.gpu/BUILD

# The device tool carries tracked files too: the limit is on everything together.
bytes=$(du -sb .gpu | cut -f1)
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((bytes + tracked))
limit=$((64 * 1024 * 1024))
cat .gpu/BUILD
awk -v a="$bytes" -v b="$total" 'BEGIN { printf "staged .gpu: %.1f MiB; with the tracked tree %.1f MiB of the 64 MiB travel limit\n", a / 1048576, b / 1048576 }' 
if [ "$total" -gt "$limit" ]; then
  echo "stage.sh: over the travel limit: leave out --anchors or --baseline" >&2
  exit 1
fi
echo 'next: the device tool, carry [".gpu"], command "bash scripts/gpu/run.sh tests e2e" (steps: scripts/gpu/run.sh --help)'
