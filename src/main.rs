//! The `streamrecon` command line: parses arguments and hands them to the library.

use clap::{Parser, Subcommand};
use streamrecon::cli;

#[derive(Debug, Parser)]
#[command(
    name = "streamrecon",
    version,
    about = "Real-time 3D reconstruction viewer (GCT streaming model, paged KV cache)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand, `streamrecon` is `streamrecon view` and takes its options.
    #[command(flatten)]
    view: cli::view::ViewArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Open the viewer on a live input (the default when no subcommand is given).
    View(cli::view::ViewArgs),
    /// Run the pipeline without a window and write a session.
    Run(cli::run::RunArgs),
    /// Time the attention kernels or the whole model.
    Bench(cli::bench::BenchArgs),
    /// Replay a reference fixture and compare every tensor against it.
    Parity(cli::parity::ParityArgs),
    /// Simulate the paged KV cache over a stream and print what each step's attention sees.
    CacheSim(cli::cache_sim::CacheSimArgs),
    /// Replay a recorded session in the viewer.
    Replay(cli::replay::ReplayArgs),
    /// Export a recorded session (PLY, TUM, COLMAP, GLB).
    Export(cli::export::ExportArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Cli::parse();
    let result = match args.command.unwrap_or(Command::View(args.view)) {
        Command::View(a) => cli::view::run(a),
        Command::Run(a) => cli::run::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Parity(a) => cli::parity::run(a),
        Command::CacheSim(a) => cli::cache_sim::run(a),
        Command::Replay(a) => cli::replay::run(a),
        Command::Export(a) => cli::export::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", cli::error_text(&err));
            std::process::ExitCode::from(2)
        }
    }
}
