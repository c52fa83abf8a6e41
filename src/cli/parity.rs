//! `streamrecon parity`: replay a reference fixture and compare every tensor.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ParityArgs {
    /// Scenario directory holding config.json, inputs/outputs/intermediates/kv_state safetensors.
    pub scenario: PathBuf,
    /// Weights file (safetensors or PyTorch .pt); default: weights.safetensors beside the scenario.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// KV layout used by the global attention.
    #[arg(long, default_value = "paged")]
    pub attention: String,
}

pub fn run(_args: ParityArgs) -> anyhow::Result<()> {
    super::not_yet("parity", "the CPU model arrives with the CPU model issue")
}
