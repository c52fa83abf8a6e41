//! `--backend auto|cpu|cuda` of `run` and `view` (the choice itself is the library's:
//! [`crate::backend::load::load_frame_model`]).

use crate::backend::Preference;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendArg {
    /// The GPU when CUDA works here, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl From<BackendArg> for Preference {
    fn from(arg: BackendArg) -> Self {
        match arg {
            BackendArg::Auto => Preference::Auto,
            BackendArg::Cpu => Preference::Cpu,
            BackendArg::Cuda => Preference::Cuda,
        }
    }
}
