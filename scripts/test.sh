#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine and runs every check: formatting, clippy, all tests.
# GPU tests skip with a printed reason where no GPU is present; kernels are still compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
# shellcheck source=/dev/null
source scripts/cuda-env.sh
# Where the shared fixtures are present (a checkout beside shared/, as in CI), the parity tests
# must run against them: a missing fixture then fails instead of skipping.
if [ -d ../shared/fixtures ]; then
  export STREAMRECON_REQUIRE_FIXTURES=1
fi
# A one-shot run gains nothing from incremental state, which would take gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
