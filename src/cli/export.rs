//! `streamrecon export SESSION`: the recorded cloud, trajectory, cameras and maps in other
//! tools' formats (docs/recording-format.md, "Exports").

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use crate::record::export::colmap::{ColmapOptions, ImageMode};
use crate::record::export::{
    CloudOptions, OutputKind, OutputPlan, Up, colmap, depth, gather_cloud_in, glb, nerfstudio, ply,
    sessions, tum,
};
use crate::record::{SESSION_FILE, SessionReader};

/// `--up`: which axis is up in the exported world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpArg {
    /// The model's own frame (OpenCV-like, y down): the default.
    #[value(name = "-y")]
    NegY,
    /// Turned half a turn about x: y up (glTF, three.js).
    #[value(name = "y")]
    Y,
    /// Turned a quarter turn about x: z up (Blender, Open3D).
    #[value(name = "z")]
    Z,
}

impl From<UpArg> for Up {
    fn from(u: UpArg) -> Self {
        match u {
            UpArg::NegY => Up::NegY,
            UpArg::Y => Up::Y,
            UpArg::Z => Up::Z,
        }
    }
}

/// What `--colmap-images` puts in the model's `images/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColmapImages {
    /// The user's own frames (linked, else copied) from the folder the session read.
    Original,
    /// The model's input as recorded (JPEG); cameras at the model's input size.
    Model,
    /// No images; cameras at the captured size.
    None,
}

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
    /// COLMAP model in this directory: sparse/0/{cameras,images,points3D}.bin and images/.
    #[arg(long, value_name = "DIR")]
    pub colmap: Option<PathBuf>,
    /// Write the COLMAP model as .txt files instead of .bin.
    #[arg(long)]
    pub colmap_text: bool,
    /// The COLMAP images: default `original` when the session's frames came from an image
    /// folder that is found (recorded in the session, or --images-from), else `model`.
    #[arg(long, value_enum, value_name = "WHICH")]
    pub colmap_images: Option<ColmapImages>,
    /// The folder holding the session's original frames (when the session does not record
    /// it, or they moved); names and sizes are checked against the session.
    #[arg(long, value_name = "DIR")]
    pub images_from: Option<PathBuf>,
    /// Most points in the COLMAP model (the most confident are kept).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub max_points: usize,
    /// Export only model session N (1 = the first; a reset starts the next). Without it a
    /// recording with several writes one set of outputs per session, suffixed `-session-N`.
    #[arg(long = "session", value_name = "N")]
    pub session_index: Option<usize>,
    /// nerfstudio dataset in this directory: transforms.json and images/ (the same images and
    /// cameras as --colmap's, chosen by --colmap-images).
    #[arg(long, value_name = "DIR")]
    pub nerfstudio: Option<PathBuf>,
    /// Depth and confidence maps in this directory: 16-bit PNGs per frame and depth.json with
    /// their scales, intrinsics and poses.
    #[arg(long, value_name = "DIR")]
    pub depth: Option<PathBuf>,
    /// Store the --depth maps as float32 .npy files (values as recorded) instead of PNGs.
    #[arg(long)]
    pub depth_npy: bool,
    /// GLB scene: the cloud as points and the cameras as frustums.
    #[arg(long, value_name = "FILE")]
    pub glb: Option<PathBuf>,
    /// Add a glTF camera per keyframe to the GLB (Blender: look through a frame).
    #[arg(long)]
    pub glb_cameras: bool,
    /// Leave out points with confidence below this.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub min_confidence: f32,
    /// Downsample to one point per voxel of this edge length (scene units).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub voxel: Option<f32>,
    /// Depth of the GLB camera frustums (default: 5 % of the scene's extent).
    #[arg(long, value_name = "DEPTH", allow_hyphen_values = true)]
    pub frustum_size: Option<f32>,
    /// Add a normal per point to the PLY (nx ny nz, from its frame's depth map).
    #[arg(long)]
    pub normals: bool,
    /// The exported world's up axis, for every output alike: `-y` keeps the model's frame
    /// (x right, y down, z forward from the first camera), `y` or `z` turn it about x.
    #[arg(long, value_enum, default_value = "-y", allow_hyphen_values = true)]
    pub up: UpArg,
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

/// Which images the COLMAP model gets, and a line saying why when it was not asked for.
fn colmap_images(
    args: &ExportArgs,
    reader: &SessionReader,
    frames: &Range<usize>,
) -> anyhow::Result<(ImageMode, Option<String>)> {
    let folder = args
        .images_from
        .clone()
        .or_else(|| colmap::recorded_input_folder(reader));
    Ok(match args.colmap_images {
        Some(ColmapImages::Model) => (ImageMode::Model, None),
        Some(ColmapImages::None) => (ImageMode::None, None),
        Some(ColmapImages::Original) => match folder {
            Some(dir) => (ImageMode::Original(dir), None),
            None => bail!(
                "--colmap-images original: the session does not record a folder its frames \
                 came from that exists here; give --images-from DIR (or --colmap-images model)"
            ),
        },
        None => {
            let files = reader.frames()[frames.clone()]
                .iter()
                .all(|f| colmap::is_file_name(&f.origin.name) && f.origin.original_size.is_some());
            match folder {
                Some(dir) if files => (ImageMode::Original(dir), None),
                _ if !files => (
                    ImageMode::Model,
                    Some(
                        "the session's frames are not all image files (a video, a camera, or \
                         a version-1 session): images/ holds the model's input and the \
                         cameras are at its size"
                            .into(),
                    ),
                ),
                _ => (
                    ImageMode::Model,
                    Some(
                        "the folder of the original frames is not known here (give \
                         --images-from DIR): images/ holds the model's input and the cameras \
                         are at its size"
                            .into(),
                    ),
                ),
            }
        }
    })
}

fn check_numbers(args: &ExportArgs) -> anyhow::Result<()> {
    if args.ply.is_none()
        && args.tum.is_none()
        && args.colmap.is_none()
        && args.glb.is_none()
        && args.nerfstudio.is_none()
    {
        bail!(
            "nothing to export: give at least one of --ply, --tum, --colmap, --glb, --nerfstudio"
        );
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
    if args.normals && args.ply.is_none() {
        bail!("--normals goes with --ply FILE (the normals are PLY properties)");
    }
    if args.depth_npy && args.depth.is_none() {
        bail!("--depth-npy goes with --depth DIR");
    }
    if args.glb_cameras && args.glb.is_none() {
        bail!("--glb-cameras goes with --glb FILE");
    }
    if args.max_points == 0 {
        bail!("--max-points must be at least 1");
    }
    if args.session_index == Some(0) {
        bail!("--session counts from 1 (the recording's first model session)");
    }
    if args.colmap.is_none() && args.colmap_text {
        bail!("--colmap-text goes with --colmap DIR");
    }
    if args.colmap.is_none()
        && args.nerfstudio.is_none()
        && (args.colmap_images.is_some() || args.images_from.is_some())
    {
        bail!("--colmap-images and --images-from go with --colmap DIR or --nerfstudio DIR");
    }
    Ok(())
}

/// Checks every output (suffixed for session `n` when given) before anything is written.
fn plan_outputs(args: &ExportArgs, input: &Path, sessions: &[usize]) -> anyhow::Result<()> {
    let mut plan = OutputPlan::new(&[input], args.force);
    let outputs = [
        ("--ply", &args.ply, OutputKind::File),
        ("--tum", &args.tum, OutputKind::File),
        ("--colmap", &args.colmap, OutputKind::ColmapDir),
        ("--glb", &args.glb, OutputKind::File),
        ("--nerfstudio", &args.nerfstudio, OutputKind::NerfstudioDir),
        ("--depth", &args.depth, OutputKind::DepthDir),
    ];
    for (flag, path, kind) in outputs {
        let Some(path) = path else { continue };
        if sessions.is_empty() {
            plan.claim(flag, path, kind)?;
        }
        for &n in sessions {
            plan.claim(flag, &sessions::suffixed(path, n), kind)?;
        }
    }
    Ok(())
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    check_numbers(&args)?;
    // Every output is checked before anything is written: one refused output writes nothing
    // at all. The plain paths first (an output onto the session is refused before it is read).
    let input = session_file(&args.session);
    plan_outputs(&args, &input, &[])?;
    let reader = open_session(&args.session)?;
    println!(
        "session: {} ({} frames, format version {})",
        reader.path().display(),
        reader.frames().len(),
        reader.version()
    );
    if reader.version() < 2 {
        println!(
            "note:    a version-1 session records no capture times, source names or sizes as \
             captured: the TUM times are seconds since its recording started, images are named \
             frame_NNNNNN, cameras are at the model's input size"
        );
    }
    let all = sessions::model_sessions(&reader);
    let chosen: Vec<(usize, Range<usize>)> = match args.session_index {
        Some(n) if n > all.len() => bail!(
            "--session {n}: the recording holds {} model session(s)",
            all.len()
        ),
        Some(n) => vec![(n, all[n - 1].clone())],
        None => all
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, r)| (i + 1, r))
            .collect(),
    };
    let split = args.session_index.is_none() && all.len() > 1;
    if split {
        println!(
            "note:    {} model sessions (resets): their worlds are not aligned, so each gets its \
             own files, suffixed -session-N (--session N exports one)",
            all.len()
        );
        let numbers: Vec<usize> = chosen.iter().map(|(n, _)| *n).collect();
        plan_outputs(&args, &input, &numbers)?;
    }
    if chosen.is_empty() {
        // An empty recording still writes its (empty) files, as before.
        return export_one(&args, &reader, 0..0, None);
    }
    for (n, frames) in chosen {
        if all.len() > 1 {
            println!(
                "model session {n}: frames {}..={}",
                reader.frames()[frames.start].frame,
                reader.frames()[frames.end - 1].frame
            );
        }
        export_one(&args, &reader, frames, split.then_some(n))?;
    }
    Ok(())
}

/// The outputs of one model session (`suffix`: its number, when each session gets its files).
fn export_one(
    args: &ExportArgs,
    reader: &SessionReader,
    frames: Range<usize>,
    suffix: Option<usize>,
) -> anyhow::Result<()> {
    let out = |p: &Path| match suffix {
        Some(n) => sessions::suffixed(p, n),
        None => p.to_path_buf(),
    };
    let up = Up::from(args.up);
    let infos = up.frames(&reader.frames()[frames.clone()]);
    let infos = infos.as_slice();
    let needs_cloud = args.ply.is_some() || args.colmap.is_some() || args.glb.is_some();
    let mut cloud = if needs_cloud {
        gather_cloud_in(
            reader,
            frames.clone(),
            CloudOptions {
                min_confidence: args.min_confidence,
                voxel: args.voxel,
                normals: args.normals && args.ply.is_some(),
            },
        )?
    } else {
        Default::default()
    };
    up.cloud(&mut cloud);
    if let Some(path) = &args.ply {
        let path = out(path);
        ply::export_ply(&path, &cloud)?;
        println!(
            "ply:     {} ({} points{})",
            path.display(),
            cloud.len(),
            if cloud.normal.is_empty() {
                ""
            } else {
                ", with normals"
            }
        );
    }
    if let Some(path) = &args.tum {
        let path = out(path);
        let n = tum::export_tum(&path, infos)?;
        println!("tum:     {} ({n} poses)", path.display());
    }
    if let Some(dir) = &args.colmap {
        let dir = out(dir);
        let (images, why) = colmap_images(args, reader, &frames)?;
        if let Some(why) = why {
            println!("note:    {why}");
        }
        let options = ColmapOptions {
            text: args.colmap_text,
            images,
            max_points: args.max_points,
            up,
        };
        let r = colmap::export_colmap(&dir, reader, frames.clone(), &cloud, &options)?;
        print_colmap(&dir, &options, &r);
    }
    if let Some(dir) = &args.nerfstudio {
        let dir = out(dir);
        let (images, why) = colmap_images(args, reader, &frames)?;
        if let Some(why) = why {
            println!("note:    {why}");
        }
        let options = ColmapOptions {
            text: false,
            images,
            max_points: 0,
            up,
        };
        let r = nerfstudio::export_nerfstudio(&dir, reader, frames.clone(), &options)?;
        println!(
            "nerfstudio: {} (transforms.json, {} frames; images: {})",
            dir.display(),
            r.images,
            images_placed(&options.images, &r)
        );
        if r.images_without_jpeg > 0 {
            eprintln!(
                "warning: {} images have no recorded JPEG in {}",
                r.images_without_jpeg,
                dir.join("images").display()
            );
        }
    }
    if let Some(dir) = &args.depth {
        let dir = out(dir);
        let format = if args.depth_npy {
            depth::DepthFormat::Npy
        } else {
            depth::DepthFormat::Png16
        };
        let r = depth::export_depth(&dir, reader, frames.clone(), infos, format)?;
        println!(
            "depth:   {} ({} frames of depth and confidence)",
            dir.display(),
            r.frames
        );
        if r.frames_without_depth > 0 {
            eprintln!(
                "warning: {} frames have no depth map recorded: left out of {}",
                r.frames_without_depth,
                dir.display()
            );
        }
    }
    if let Some(path) = &args.glb {
        let path = out(path);
        glb::export_glb(&path, infos, &cloud, args.frustum_size, args.glb_cameras)?;
        println!(
            "glb:     {} ({} points, {} cameras)",
            path.display(),
            cloud.len(),
            infos.len()
        );
    }
    Ok(())
}

/// Where an export's images came from, and how many were placed.
fn images_placed(mode: &ImageMode, r: &colmap::ColmapReport) -> String {
    match mode {
        ImageMode::Original(from) => format!(
            "the original frames from {} ({} linked, {} copied)",
            from.display(),
            r.images_linked,
            r.images_copied
        ),
        ImageMode::Model => format!(
            "the model's input ({} written)",
            r.images - r.images_without_jpeg.min(r.images)
        ),
        ImageMode::None => "none written".into(),
    }
}

fn print_colmap(dir: &Path, options: &ColmapOptions, r: &colmap::ColmapReport) {
    let images = images_placed(&options.images, r);
    println!(
        "colmap:  {} (sparse/0 {}, {} images: {images}; {} points)",
        dir.display(),
        if options.text { "text" } else { "binary" },
        r.images,
        r.points
    );
    if r.points_over_cap > 0 {
        println!(
            "note:    {} less confident points over --max-points {} left out of points3D",
            r.points_over_cap, options.max_points
        );
    }
    if r.points_unseen > 0 {
        eprintln!(
            "warning: {} points project outside their frame (or their frame is not in the \
             model) and were left out of points3D",
            r.points_unseen
        );
    }
    if r.cameras_at_input_size > 0 {
        eprintln!(
            "warning: {} frames record no size as captured: their cameras are at the model's \
             input size",
            r.cameras_at_input_size
        );
    }
    if r.cameras_plain_scale > 0 {
        eprintln!(
            "warning: {} frames' captured size is not what the model's preprocessing turns \
             into their input size: their cameras are scaled per axis without a crop",
            r.cameras_plain_scale
        );
    }
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
