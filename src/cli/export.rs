//! `streamrecon export SESSION`: the recorded cloud and trajectory in other tools' formats.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use crate::record::export::{
    CloudOptions, OutputKind, OutputPlan, colmap, gather_cloud, glb, ply, tum,
};
use crate::record::{SESSION_FILE, SessionReader};

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The session file, or a session directory holding `session.srec`.
    #[arg(value_name = "SESSION")]
    pub session: PathBuf,
    /// Binary PLY of the cloud: x y z, red green blue, confidence, frame.
    #[arg(long, value_name = "FILE")]
    pub ply: Option<PathBuf>,
    /// Camera trajectory in TUM format (timestamp tx ty tz qx qy qz qw, camera to world).
    #[arg(long, value_name = "FILE")]
    pub tum: Option<PathBuf>,
    /// COLMAP text model (cameras.txt, images.txt, points3D.txt, images/) in this directory.
    #[arg(long, value_name = "DIR")]
    pub colmap: Option<PathBuf>,
    /// GLB scene: the cloud as points and the cameras as frustums.
    #[arg(long, value_name = "FILE")]
    pub glb: Option<PathBuf>,
    /// Leave out points with confidence below this.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub min_confidence: f32,
    /// Downsample to one point per voxel of this edge length (scene units).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub voxel: Option<f32>,
    /// Depth of the GLB camera frustums (default: 5 % of the scene's extent).
    #[arg(long, value_name = "DEPTH", allow_hyphen_values = true)]
    pub frustum_size: Option<f32>,
    /// Replace outputs that exist already (never the session itself).
    #[arg(long)]
    pub force: bool,
}

/// A session directory (as `run --out` makes) stands for the file inside it.
pub fn session_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(SESSION_FILE)
    } else {
        path.to_path_buf()
    }
}

/// Opens a session and prints what the reader had to skip and what the recorder noted.
pub fn open_session(path: &Path) -> anyhow::Result<SessionReader> {
    let file = session_file(path);
    let reader = SessionReader::open(&file)
        .with_context(|| format!("opening the session {}", file.display()))?;
    for issue in reader.issues() {
        eprintln!("warning: {issue}");
    }
    if !reader.indexed() {
        eprintln!(
            "warning: {} was not closed (no index): read by scanning its records",
            file.display()
        );
    }
    for notice in reader.notices() {
        eprintln!("recorder notice: {}", notice.message);
    }
    Ok(reader)
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    if args.ply.is_none() && args.tum.is_none() && args.colmap.is_none() && args.glb.is_none() {
        bail!("nothing to export: give at least one of --ply, --tum, --colmap, --glb");
    }
    if let Some(v) = args.voxel
        && !(v.is_finite() && v > 0.0)
    {
        bail!("--voxel must be a positive length, got {v}");
    }
    if let Some(d) = args.frustum_size
        && !(d.is_finite() && d > 0.0)
    {
        bail!("--frustum-size must be a positive length, got {d}");
    }
    if !args.min_confidence.is_finite() {
        bail!(
            "--min-confidence must be a finite number, got {}",
            args.min_confidence
        );
    }
    // Every output is checked before anything is read or written: one refused output
    // writes nothing at all.
    let input = session_file(&args.session);
    let mut plan = OutputPlan::new(&[&input], args.force);
    let outputs = [
        ("--ply", &args.ply, OutputKind::File),
        ("--tum", &args.tum, OutputKind::File),
        ("--colmap", &args.colmap, OutputKind::ColmapDir),
        ("--glb", &args.glb, OutputKind::File),
    ];
    for (flag, path, kind) in outputs {
        if let Some(path) = path {
            plan.claim(flag, path, kind)?;
        }
    }
    let reader = open_session(&args.session)?;
    println!(
        "session: {} ({} frames, format version {})",
        reader.path().display(),
        reader.frames().len(),
        reader.version()
    );
    if reader.version() < 2 {
        println!(
            "note:    a version-1 session records no capture times or source names: the TUM \
             times are seconds since its recording started, images are named frame_NNNNNN"
        );
    }
    let needs_cloud = args.ply.is_some() || args.colmap.is_some() || args.glb.is_some();
    let cloud = if needs_cloud {
        gather_cloud(
            &reader,
            CloudOptions {
                min_confidence: args.min_confidence,
                voxel: args.voxel,
            },
        )?
    } else {
        Default::default()
    };
    if let Some(path) = &args.ply {
        ply::export_ply(path, &cloud)?;
        println!("ply:     {} ({} points)", path.display(), cloud.len());
    }
    if let Some(path) = &args.tum {
        let n = tum::export_tum(path, &reader)?;
        println!("tum:     {} ({n} poses)", path.display());
    }
    if let Some(dir) = &args.colmap {
        let r = colmap::export_colmap(dir, &reader, &cloud)?;
        println!(
            "colmap:  {} ({} images, {} points)",
            dir.display(),
            r.images,
            r.points
        );
        if r.frames_skipped > 0 {
            eprintln!(
                "warning: {} frames without intrinsics left out of the COLMAP model",
                r.frames_skipped
            );
        }
        if r.images_without_jpeg > 0 {
            eprintln!(
                "warning: {} images have no recorded JPEG in {}",
                r.images_without_jpeg,
                dir.join("images").display()
            );
        }
    }
    if let Some(path) = &args.glb {
        glb::export_glb(path, &reader, &cloud, args.frustum_size)?;
        println!(
            "glb:     {} ({} points, {} cameras)",
            path.display(),
            cloud.len(),
            reader.frames().len()
        );
    }
    Ok(())
}
