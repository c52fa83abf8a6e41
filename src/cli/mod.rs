//! Subcommand implementations. `main.rs` parses; these run. Each returns `anyhow::Result` because
//! this is the edge of the program where errors become messages for a person.

pub mod backend_choice;
pub mod bench;
pub mod bench_e2e;
pub mod cache_sim;
pub mod export;
pub mod model_source;
pub mod parity;
pub mod replay;
pub mod run;
pub mod stream_args;
pub mod view;

/// What a subcommand that a later piece of work fills in says, so it never pretends to work.
pub fn not_yet(command: &str, what: &str) -> anyhow::Result<()> {
    anyhow::bail!("`streamrecon {command}` is not implemented yet: {what}. Nothing was done.")
}
