#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine and runs every check: formatting, clippy, all tests.
# GPU tests skip with a printed reason where no GPU is present; kernels are still compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
# shellcheck source=/dev/null
source scripts/cuda-env.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
