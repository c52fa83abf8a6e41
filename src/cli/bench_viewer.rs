//! `streamrecon bench viewer`: [`crate::bench::viewer`] (the 3D view offscreen on a headless
//! wgpu adapter) with its progress on stderr, the whole report as JSON (`--json`), and a short
//! table on stdout last.

use std::io::Write as _;

use anyhow::{Context, bail};

use super::bench::BenchArgs;
use crate::bench::viewer::{
    Budget, PathChoice, PointSource, ViewerBenchConfig, ViewerBenchReport, ViewerProgress,
    run_viewer_bench,
};
use crate::viewer::raster::RenderPath;

fn parse_size(flag: &str, s: &str) -> anyhow::Result<(u32, u32)> {
    let (w, h) = s
        .split_once('x')
        .with_context(|| format!("{flag} `{s}`: expected WIDTHxHEIGHT, e.g. 1920x1080"))?;
    let parse = |v: &str, what: &str| -> anyhow::Result<u32> {
        v.trim()
            .parse()
            .with_context(|| format!("{flag} `{s}`: bad {what}"))
    };
    Ok((parse(w, "width")?, parse(h, "height")?))
}

fn parse_points(s: &str) -> anyhow::Result<Vec<u64>> {
    s.split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let millions: f64 = c
                .trim()
                .parse()
                .with_context(|| format!("--points `{c}`: expected millions, e.g. 4 or 0.3"))?;
            if !(millions.is_finite() && millions > 0.0) {
                bail!("--points `{c}`: must be more than 0");
            }
            Ok((millions * 1e6).round() as u64)
        })
        .collect()
}

fn parse_paths(s: &str) -> anyhow::Result<Vec<PathChoice>> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "auto" => out.push(PathChoice::Auto),
            "all" => out.extend(RenderPath::ALL.map(PathChoice::Path)),
            other => {
                out.push(PathChoice::Path(other.parse().map_err(|e: String| {
                    anyhow::anyhow!("--path: {e}; or auto, all")
                })?))
            }
        }
    }
    if out.is_empty() {
        bail!("--path names no path (sprites, compute, compute32, auto, all)");
    }
    Ok(out)
}

fn parse_budgets(args: &BenchArgs) -> anyhow::Result<Vec<Budget>> {
    let Some(list) = &args.budgets else {
        return Ok(vec![if args.every_point {
            Budget::EveryPoint
        } else {
            Budget::Default
        }]);
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n {
            "every" => Ok(Budget::EveryPoint),
            "default" => Ok(Budget::Default),
            other => bail!("--budgets `{other}`: expected every or default"),
        })
        .collect()
}

fn config(args: &BenchArgs) -> anyhow::Result<ViewerBenchConfig> {
    let (width, height) = parse_size("--size", &args.size)?;
    let source = match &args.session {
        Some(path) => PointSource::Session(path.clone()),
        None => {
            let (width, height) = parse_size("--room-frame", &args.room_frame)?;
            PointSource::SyntheticRoom { width, height }
        }
    };
    Ok(ViewerBenchConfig {
        width,
        height,
        points: parse_points(&args.points)?,
        source,
        frames: args.frames,
        warmup: args.warmup,
        paths: parse_paths(&args.path)?,
        budgets: parse_budgets(args)?,
        point_size_px: args.point_size,
        compare: !args.no_compare,
        save_pictures: args.save_pictures.clone(),
        ..ViewerBenchConfig::default()
    })
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = config(args)?;
    let report = run_viewer_bench(&cfg, |progress| match progress {
        ViewerProgress::Opened { adapter, timing } => {
            eprintln!("bench viewer: {adapter}; timing by {timing}")
        }
        ViewerProgress::Filled { points, seconds } => {
            eprintln!("bench viewer: {points} points stored ({seconds:.1} s)")
        }
        ViewerProgress::CaseDone(case) => eprintln!(
            "bench viewer: {} points, {}, {:?}: {:.3} ms median GPU",
            case.points_stored,
            case.path.name(),
            case.budget,
            case.gpu_ms_median
        ),
        ViewerProgress::Agreement(a) => eprintln!(
            "bench viewer: {} against {}: {:.3} % of covered pixels differ",
            a.path.name(),
            a.against.name(),
            a.differing_fraction * 100.0
        ),
    })?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json {
        // Through a temporary file: an interrupted write never leaves half a report.
        crate::record::export::write_file(path, |w| w.write_all(json.as_bytes()))
            .with_context(|| format!("--json {}", path.display()))?;
    }
    print_table(&report);
    let disagreeing: Vec<String> = report
        .agreement
        .iter()
        .filter(|a| !a.within_tolerance)
        .map(|a| {
            format!(
                "{} at {} points: {:.2} % of covered pixels in colour, {:.2} % in coverage",
                a.path.name(),
                a.points_stored,
                a.differing_fraction * 100.0,
                a.diff.coverage_differing_fraction() * 100.0
            )
        })
        .collect();
    if !disagreeing.is_empty() {
        bail!(
            "the compute path drew a different picture from the sprites (tolerance: {:.0} % of covered pixels in colour, {:.1} % in coverage): {}",
            crate::viewer::picture::MAX_DIFFERING_FRACTION * 100.0,
            crate::viewer::picture::MAX_COVERAGE_DIFFERING_FRACTION * 100.0,
            disagreeing.join("; ")
        );
    }
    Ok(())
}

fn print_table(r: &ViewerBenchReport) {
    println!(
        "\nbench viewer: {} ({}), {}x{}, {}; {} B a point, timing by {}; window path: {}",
        r.adapter,
        r.device_type,
        r.width,
        r.height,
        r.source,
        r.point_bytes,
        r.timing,
        r.auto_path.name()
    );
    println!(
        "append: {} frames, median {} points a frame: {:.2} ms median, {:.2} ms p95{}",
        r.append.frames,
        r.append.points_per_frame_median,
        r.append.ms_median,
        r.append.ms_p95,
        if r.append.refused_points > 0 {
            format!(" ({} points refused: GPU memory)", r.append.refused_points)
        } else {
            String::new()
        }
    );
    println!(
        "{:>11} {:>10} {:>12} {:>11} {:>10} {:>9} {:>9} {:>8} {:>10}",
        "points", "path", "budget", "drawn", "GPU ms", "p95 ms", "wall ms", "FPS", "point MiB"
    );
    for c in &r.cases {
        println!(
            "{:>11} {:>10} {:>12} {:>11} {:>10.3} {:>9.3} {:>9.3} {:>8.1} {:>10.0}",
            c.points_stored,
            c.path.name(),
            match c.budget {
                Budget::EveryPoint => "every point",
                Budget::Default => "default",
            },
            c.points_drawn,
            c.gpu_ms_median,
            c.gpu_ms_p95,
            c.wall_ms_median,
            c.fps_gpu,
            c.point_memory_bytes as f64 / (1 << 20) as f64
        );
    }
    for a in &r.agreement {
        println!(
            "agreement: {} vs {} at {} points: of {} covered pixels {:.3} % differ in colour, {:.3} % in coverage: {}",
            a.path.name(),
            a.against.name(),
            a.points_stored,
            a.diff.covered,
            a.differing_fraction * 100.0,
            a.diff.coverage_differing_fraction() * 100.0,
            if a.within_tolerance {
                "within tolerance"
            } else {
                "OUTSIDE tolerance"
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_millions_and_paths_names() {
        assert_eq!(
            parse_points("4,20,0.25").ok(),
            Some(vec![4_000_000, 20_000_000, 250_000])
        );
        assert!(parse_points("4,x").is_err());
        assert!(parse_points("-1").is_err());
        assert_eq!(
            parse_paths("sprites,compute32").ok(),
            Some(vec![
                PathChoice::Path(RenderPath::Sprites),
                PathChoice::Path(RenderPath::Compute32)
            ])
        );
        assert!(parse_paths("fast").is_err());
        assert_eq!(parse_size("--size", "640x360").ok(), Some((640, 360)));
        assert!(parse_size("--size", "640").is_err());
    }
}
