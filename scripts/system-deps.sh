#!/usr/bin/env bash
# Installs the system packages streamrecon needs to build on Debian/Ubuntu:
# a C toolchain, libclang (nokhwa's V4L2 and ffmpeg-sys-next's FFmpeg bindings are generated
# with bindgen), pkg-config, FFmpeg's development libraries (video input; Debian 12: 5.1) and its
# command-line tool (tests write rotation metadata and audio-only files with it), and the
# X11/Vulkan pieces the viewer loads at run time.
set -euo pipefail
packages=(build-essential pkg-config libclang-dev curl ca-certificates python3 python3-venv
          libx11-dev libxkbcommon-dev libvulkan1 mesa-vulkan-drivers
          libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "installing system packages: ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust 1.95 or newer (https://rustup.rs), then run this again" >&2
  exit 1
fi
