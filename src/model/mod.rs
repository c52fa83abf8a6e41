//! The GCT streaming model (filled in by the CPU model work).
