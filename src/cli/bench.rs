//! `streamrecon bench`: timing runs that print JSON and a short table.

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to time: `attention` or `e2e`.
    pub what: String,
}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    super::not_yet("bench", "the GPU benchmarks arrive with the CUDA backend issue")
}
