//! Compute backends: the CPU reference and CUDA (filled in by the CUDA backend work).
