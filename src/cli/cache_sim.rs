//! `streamrecon cache-sim` (placeholder until the cache lands).
#[derive(Debug, clap::Args)]
pub struct CacheSimArgs {}
pub fn run(_a: CacheSimArgs) -> anyhow::Result<()> { Ok(()) }
