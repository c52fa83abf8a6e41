#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine, builds streamrecon (release) and runs it with the
# given arguments (none: the viewer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
# shellcheck source=/dev/null
source scripts/cuda-env.sh
cargo build --release --locked --bin streamrecon
exec ./target/release/streamrecon "$@"
