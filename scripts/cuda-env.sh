# Sourced, not run: puts CUDA 13.0's nvcc and NVRTC on PATH/LD_LIBRARY_PATH when they can be
# had, so build.rs compiles kernels/*.cu to CUBIN and the tests compile every kernel with NVRTC.
# A machine without the shared toolchain script or without network to PyPI still builds and
# tests (kernels are then compiled at run time, and the NVRTC test says why it skipped).
_streamrecon_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_toolchain="$_streamrecon_root/../shared/tools/cuda-toolchain"
if ! command -v nvcc >/dev/null 2>&1 && [ -f "$_toolchain" ]; then
  if _exports=$(bash "$_toolchain"); then
    eval "$_exports"
    # With the toolchain present, a kernel that does not compile must fail the tests, not skip.
    export STREAMRECON_REQUIRE_NVRTC=1
  else
    echo "note: could not install the CUDA 13.0 toolchain; kernels will be compiled at run time" >&2
  fi
fi
unset _streamrecon_root _toolchain _exports
