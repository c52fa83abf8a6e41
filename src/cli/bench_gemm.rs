//! `streamrecon bench gemm`: prints every candidate's time for each product, as a table.

use std::io::Write as _;

use super::bench::BenchArgs;
use crate::bench::gemm::{GemmReport, frame_shapes, parse_shapes, run_gemm};

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let shapes = match &args.shapes {
        Some(list) => parse_shapes(list)?,
        None => frame_shapes(),
    };
    let report = run_gemm(args.device, &shapes, args.iters)?;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        // Through a temporary file: an interrupted write never leaves half a report.
        crate::record::export::write_file(path, |w| w.write_all(json.as_bytes()))?;
    }
    print_table(&report);
    Ok(())
}

fn print_table(r: &GemmReport) {
    println!(
        "gemm, {}: each candidate's mean of {} launches after one untimed",
        r.device, r.reps
    );
    println!("| product | kernel | ms | TFLOP/s |");
    println!("|---|---|---|---|");
    for s in &r.shapes {
        let product = format!("{}x{}x{} {}", s.m, s.n, s.k, s.epilogue);
        for c in &s.candidates {
            let mark = if c.kernel == s.chosen {
                " (chosen)"
            } else {
                ""
            };
            println!(
                "| {product} | {}{mark} | {:.4} | {:.0} |",
                c.kernel, c.ms, c.tflops
            );
        }
    }
}
