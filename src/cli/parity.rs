//! `streamrecon parity`: [`crate::parity`] on a fixture scenario, printed as a table.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::attention::AttentionLayout;
use crate::parity::{ParityReport, WeightsChoice, run_parity};

#[derive(Debug, clap::Args)]
pub struct ParityArgs {
    /// Scenario directory holding config.json, inputs/outputs/intermediates/kv_state safetensors.
    pub scenario: PathBuf,
    /// Weights file (safetensors or PyTorch .pt); default: weights.safetensors beside the scenario.
    /// `hf` downloads the released checkpoint from the Hugging Face hub (into its usual cache).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// KV layout used by the global attention.
    #[arg(long, value_enum, default_value_t = AttentionLayout::Paged)]
    pub attention: AttentionLayout,
    /// Use seeded random weights of the given preset (`full` or `tiny`) instead of a file.
    /// Parity then fails by design; this is a smoke run of the whole schedule.
    #[arg(long, value_name = "PRESET")]
    pub random_weights: Option<String>,
    /// Seed of `--random-weights`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print only failing rows of the table.
    #[arg(long)]
    pub failures_only: bool,
}

pub fn print_report(report: &ParityReport, failures_only: bool) {
    println!(
        "{:<34} {:>12} {:>12} {:>10}  pass",
        "tensor", "max abs err", "max rel err", "err/tol"
    );
    for r in &report.rows {
        if failures_only && r.pass {
            continue;
        }
        match &r.problem {
            Some(p) => println!("{:<34} {p}  FAIL", r.name),
            None => println!(
                "{:<34} {:>12.3e} {:>12.3e} {:>10.3}  {}",
                r.name,
                r.max_abs,
                r.max_rel,
                r.worst_ratio,
                if r.pass { "ok" } else { "FAIL" }
            ),
        }
    }
    if let (Some(worst), Some(abs)) = (report.worst(), report.worst_abs()) {
        println!(
            "{} tensors, {} over tolerance; worst: {} (err/tol {:.3}, max abs err {:.3e}); largest abs err: {} ({:.3e})",
            report.rows.len(),
            report.failures(),
            worst.name,
            worst.worst_ratio,
            worst.max_abs,
            abs.name,
            abs.max_abs
        );
    }
}

pub fn run(args: ParityArgs) -> anyhow::Result<()> {
    let layout = args.attention;
    let weights = match (&args.random_weights, &args.weights) {
        (Some(_), Some(_)) => bail!("give either --weights or --random-weights, not both"),
        (Some(preset), None) => WeightsChoice::Random {
            preset: preset.clone(),
            seed: args.seed,
        },
        (None, Some(p)) if p.as_os_str() == "hf" => WeightsChoice::Hub,
        (None, Some(p)) => WeightsChoice::File(p.clone()),
        (None, None) => {
            let parent = args
                .scenario
                .parent()
                .context("scenario directory has no parent to find weights.safetensors in")?;
            WeightsChoice::File(parent.join("weights.safetensors"))
        }
    };
    let report = run_parity(&args.scenario, &weights, layout)?;
    print_report(&report, args.failures_only);
    if report.failures() > 0 {
        bail!(
            "{} of {} tensors differ from the reference beyond tolerance",
            report.failures(),
            report.rows.len()
        );
    }
    Ok(())
}
