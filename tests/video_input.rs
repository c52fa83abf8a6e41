//! Video files in, as a user gives them: a video encoded here from the courthouse frames (with
//! the FFmpeg binding) streams through `run --headless` with every frame, in order, at the
//! container's times; cuts, rotation metadata (set with Debian's `ffmpeg`, as a phone writes
//! it), a truncated file, an audio-only file and a file that is no video at all.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{streamrecon, text, tiny_run};
use streamrecon::capture::video::rotate_quarter_turns;
use streamrecon::capture::{Source, VideoCut, VideoFile, write_video};
use streamrecon::frame::{RgbImage, TimeBase};

const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);
/// The courthouse frames as a 10 fps video: frame k at k / 10 s.
const FPS: u32 = 10;

fn courthouse_frames() -> Vec<RgbImage> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(COURTHOUSE)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| {
            let img = image::open(p).unwrap().into_rgb8();
            RgbImage {
                width: img.width(),
                height: img.height(),
                data: img.into_raw(),
            }
        })
        .collect()
}

fn courthouse_video(dir: &Path, name: &str) -> (PathBuf, Vec<RgbImage>) {
    let frames = courthouse_frames();
    let path = dir.join(name);
    let written = write_video(&path, FPS, frames.clone()).unwrap();
    assert_eq!(written.frames, frames.len() as u64);
    (path, frames)
}

fn mean_abs_diff(a: &RgbImage, b: &RgbImage) -> f64 {
    assert_eq!((a.width, a.height), (b.width, b.height));
    let sum: u64 = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    sum as f64 / a.data.len() as f64
}

fn drain(source: &mut dyn Source) -> Vec<streamrecon::capture::CapturedFrame> {
    let mut out = Vec::new();
    while let Some(f) = source.next_frame().unwrap() {
        out.push(f);
    }
    out
}

/// Debian's `ffmpeg` (scripts/system-deps.sh installs it), for what the binding does not
/// write: rotation metadata, other codecs, audio.
fn ffmpeg_cli(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(args)
        .output()
        .expect("the ffmpeg command (scripts/system-deps.sh installs it)");
    assert!(
        out.status.success(),
        "ffmpeg {args:?}: {}",
        text(&out.stderr)
    );
}

#[test]
fn every_frame_comes_in_order_at_its_presentation_time() {
    let dir = tempfile::tempdir().unwrap();
    let (path, originals) = courthouse_video(dir.path(), "court.mp4");
    let mut video = VideoFile::open(&path, VideoCut::default()).unwrap();
    assert_eq!(video.frame_size_hint(), Some((518, 294)));
    let frames = drain(&mut video);
    assert_eq!(frames.len(), originals.len());
    for (k, f) in frames.iter().enumerate() {
        assert_eq!(f.index, k as u64);
        assert_eq!(f.origin.name, format!("court.mp4#frame_{k:06}"));
        assert_eq!(f.origin.time.base, TimeBase::Stream);
        assert_eq!(f.origin.time.ns, k as i64 * 100_000_000, "frame {k}");
        assert_eq!(f.origin.original_size, Some((518, 294)));
        // Its own original is the nearest: the frames are in order, none repeated.
        let own = mean_abs_diff(&f.image, &originals[k]);
        assert!(own < 6.0, "frame {k} is {own} levels off its original");
        for other in [k.wrapping_sub(1), k + 1] {
            if let Some(o) = originals.get(other) {
                assert!(
                    mean_abs_diff(&f.image, o) > own,
                    "frame {k} looks like {other}"
                );
            }
        }
    }
    assert!(video.take_warnings().is_empty());
}

#[test]
fn every_fps_start_and_duration_cut_by_presentation_time() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = courthouse_video(dir.path(), "court.mkv");
    let numbers = |cut: VideoCut| -> Vec<String> {
        let mut video = VideoFile::open(&path, cut).unwrap();
        drain(&mut video)
            .into_iter()
            .map(|f| f.origin.name.rsplit('_').next().unwrap().to_owned())
            .collect()
    };
    let every = numbers(VideoCut {
        every: 10,
        ..VideoCut::default()
    });
    assert_eq!(every, ["000000", "000010", "000020", "000030", "000040"]);
    let thinned = numbers(VideoCut {
        fps: Some(2.5),
        ..VideoCut::default()
    });
    assert_eq!(thinned.len(), 12, "{thinned:?}");
    assert_eq!(&thinned[..3], ["000000", "000004", "000008"]);
    let window = numbers(VideoCut {
        start_s: 1.0,
        duration_s: Some(0.5),
        ..VideoCut::default()
    });
    assert_eq!(window, ["000010", "000011", "000012", "000013", "000014"]);
    // A start past the end keeps nothing, and says so.
    let mut late = VideoFile::open(
        &path,
        VideoCut {
            start_s: 60.0,
            ..VideoCut::default()
        },
    )
    .unwrap();
    assert!(drain(&mut late).is_empty());
    let warnings = late.take_warnings();
    assert!(
        warnings.len() == 1 && warnings[0].contains("none of its 48 frames"),
        "{warnings:?}"
    );
}

#[test]
fn rotation_metadata_turns_frames_upright() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = courthouse_video(dir.path(), "court.mp4");
    let turned = dir.path().join("phone.mp4");
    // What a phone held upright writes: the pixels stay landscape, the metadata turns them.
    ffmpeg_cli(&[
        "-i",
        path.to_str().unwrap(),
        "-c",
        "copy",
        "-metadata:s:v",
        "rotate=90",
        turned.to_str().unwrap(),
    ]);
    let mut plain = VideoFile::open(&path, VideoCut::default()).unwrap();
    let mut phone = VideoFile::open(&turned, VideoCut::default()).unwrap();
    assert_eq!(phone.frame_size_hint(), Some((294, 518)), "portrait");
    let turns = phone.quarter_turns();
    assert_ne!(turns, 0);
    let (a, b) = (drain(&mut plain), drain(&mut phone));
    assert_eq!(a.len(), b.len());
    assert_eq!(b[0].origin.original_size, Some((294, 518)));
    // The same pixels, turned.
    assert_eq!(
        rotate_quarter_turns(a[3].image.clone(), turns).data,
        b[3].image.data
    );
    // Turned the way FFmpeg itself shows the file (its autorotation).
    let raw = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-i"])
        .arg(&turned)
        .args(["-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .unwrap();
    assert!(raw.status.success(), "{}", text(&raw.stderr));
    let theirs = RgbImage {
        width: 294,
        height: 518,
        data: raw.stdout,
    };
    let diff = mean_abs_diff(&b[0].image, &theirs);
    assert!(diff < 3.0, "{diff} levels from FFmpeg's own upright frame");
}

#[test]
fn a_video_streams_through_run_headless() {
    let dir = tempfile::tempdir().unwrap();
    let (path, originals) = courthouse_video(dir.path(), "court.mp4");
    let session = dir.path().join("session");
    let out = tiny_run(&path, &session, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let n = originals.len();
    assert!(
        stdout.contains(&format!("{n} processed of {n} captured")),
        "{stdout}"
    );
    assert!(
        stderr.contains("video") && stderr.contains("court.mp4"),
        "{stderr}"
    );
    for k in 0..n {
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(session.join(format!("frames/{k:06}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(meta["source"], format!("court.mp4#frame_{k:06}"));
        assert_eq!(
            meta["capture_time"],
            format!("{}.{:06}", k / 10, k % 10 * 100_000)
        );
        assert_eq!(meta["time_base"], "stream");
    }
    let tum = std::fs::read_to_string(session.join("trajectory.tum")).unwrap();
    let times: Vec<&str> = tum
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let want: Vec<String> = (0..n)
        .map(|k| format!("{}.{:06}", k / 10, k % 10 * 100_000))
        .collect();
    assert_eq!(times, want);
    assert!(tum.contains("video presentation time"), "{tum}");

    // Record → replay → export: the same names and times come back.
    let out = streamrecon(&["replay", session.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let replayed = text(&out.stdout);
    for k in [0, 1, 17, n - 1] {
        let line = format!("court.mp4#frame_{k:06} at {}", want[k]);
        assert!(replayed.contains(&line), "{line}: {replayed}");
    }
    let exported = dir.path().join("exported.tum");
    let colmap = dir.path().join("colmap");
    let out = streamrecon(&[
        "export",
        session.to_str().unwrap(),
        "--tum",
        exported.to_str().unwrap(),
        "--colmap",
        colmap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&exported).unwrap(), tum);
    assert!(colmap.join("images/court.mp4_frame_000047.jpg").is_file());
}

#[test]
fn a_truncated_video_keeps_the_frames_before_the_damage_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (path, originals) = courthouse_video(dir.path(), "court.mkv");
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.mkv");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 5]).unwrap();
    let session = dir.path().join("session");
    let out = tiny_run(&cut, &session, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let frames = std::fs::read_dir(session.join("frames")).unwrap().count();
    assert!(
        frames > 0 && frames < originals.len(),
        "{frames} frames\n{stdout}"
    );
    assert!(
        stdout.contains(&format!("{frames} processed of {frames} captured")),
        "{stdout}"
    );
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains("cut.mkv") && said.contains("damaged or cut short"),
        "{said}"
    );
    assert!(
        said.contains(&format!("the {frames} frames before it were used")),
        "{said}"
    );
    // The frames kept are the first ones, in order.
    let last: serde_json::Value = serde_json::from_slice(
        &std::fs::read(session.join(format!("frames/{:06}.json", frames - 1))).unwrap(),
    )
    .unwrap();
    assert_eq!(last["source"], format!("cut.mkv#frame_{:06}", frames - 1));

    // An MP4 cut before its index cannot be read at all, and the error says why.
    let (mp4, _) = courthouse_video(dir.path(), "court.mp4");
    let bytes = std::fs::read(&mp4).unwrap();
    let cut = dir.path().join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = tiny_run(&cut, &dir.path().join("s2"), &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cut.mp4") && stderr.contains("index"),
        "{stderr}"
    );
}

#[test]
fn audio_only_and_unreadable_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let audio = dir.path().join("tone.m4a");
    ffmpeg_cli(&[
        "-f",
        "lavfi",
        "-i",
        "sine=duration=1",
        "-c:a",
        "aac",
        audio.to_str().unwrap(),
    ]);
    let junk = dir.path().join("notes.mp4");
    std::fs::write(&junk, "not a video, only text").unwrap();
    let missing = dir.path().join("missing.mov");
    for (file, says) in [
        (&audio, "no video stream"),
        (&junk, "cannot read it as a video"),
        (&missing, "No such file"),
    ] {
        let name = file.file_name().unwrap().to_str().unwrap();
        let out = tiny_run(file, &dir.path().join(format!("s-{name}")), &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(stderr.contains(name) && stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // `view` opens its input the same way, before any window.
        let out = streamrecon(&["view", "--input", file.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "view {name}");
        assert!(stderr.contains(name) && stderr.contains(says), "{stderr}");
    }
    // Frames beyond the image limits are refused from the stream's header.
    let (court, _) = courthouse_video(dir.path(), "court.mp4");
    let out = tiny_run(
        &court,
        &dir.path().join("s-big"),
        &["--max-image-megapixels", "0.1"],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("court.mp4") && stderr.contains("--max-image-megapixels"),
        "{stderr}"
    );
    // Cutting flags are for videos; on another input they would do nothing, so they are refused.
    let out = tiny_run(
        Path::new(COURTHOUSE),
        &dir.path().join("s-folder"),
        &["--every", "2"],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--every") && stderr.contains("video"),
        "{stderr}"
    );
}

#[test]
fn the_sample_video_is_the_synthetic_room() {
    let dir = tempfile::tempdir().unwrap();
    let out = streamrecon(&["run", "--write-sample", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = dir
        .path()
        .join(streamrecon::capture::synthetic::SAMPLE_VIDEO_FILE);
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        size < 600 * 1024,
        "{size} bytes: the sample should stay small"
    );
    let scene = streamrecon::capture::synthetic::sample_video_scene();
    let mut video = VideoFile::open(&path, VideoCut::default()).unwrap();
    let frames = drain(&mut video);
    assert_eq!(frames.len() as u64, scene.frames.unwrap());
    let fps = streamrecon::capture::synthetic::SAMPLE_VIDEO_FPS as f64;
    for k in [0usize, 45, 89] {
        let f = &frames[k];
        let want = (k as f64 / fps * 1e9).round() as i64;
        assert!(
            (f.origin.time.ns - want).abs() <= 1,
            "frame {k}: {:?}",
            f.origin.time
        );
        let diff = mean_abs_diff(&f.image, &scene.render(k as u64).image);
        assert!(
            diff < 6.0,
            "frame {k} is {diff} levels from the room's render"
        );
    }
}

#[test]
fn other_containers_and_codecs_decode_alike() {
    let dir = tempfile::tempdir().unwrap();
    let (source, originals) = courthouse_video(dir.path(), "court.mp4");
    let encoders = text(
        &Command::new("ffmpeg")
            .args(["-hide_banner", "-encoders"])
            .output()
            .expect("the ffmpeg command (scripts/system-deps.sh installs it)")
            .stdout,
    );
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "h265.mkv",
            "libx265",
            &["-c:v", "libx265", "-x265-params", "log-level=error"],
        ),
        (
            "vp9.webm",
            "libvpx-vp9",
            &[
                "-c:v",
                "libvpx-vp9",
                "-deadline",
                "realtime",
                "-cpu-used",
                "8",
            ],
        ),
        (
            "av1.mkv",
            "libsvtav1",
            &["-c:v", "libsvtav1", "-preset", "12"],
        ),
        ("mjpeg.mov", "mjpeg", &["-c:v", "mjpeg", "-q:v", "3"]),
    ];
    let mut decoded = 0;
    for (name, encoder, codec) in cases {
        if !encoders.contains(&format!(" {encoder} ")) {
            eprintln!("{name}: this FFmpeg has no {encoder} encoder; not tried");
            continue;
        }
        let path = dir.path().join(name);
        let mut args = vec!["-i", source.to_str().unwrap()];
        args.extend_from_slice(codec);
        args.extend_from_slice(&["-pix_fmt", "yuv420p", path.to_str().unwrap()]);
        if encoder == "mjpeg" {
            args.retain(|a| *a != "yuv420p" && *a != "-pix_fmt");
        }
        ffmpeg_cli(&args);
        let mut video = VideoFile::open(&path, VideoCut::default()).unwrap();
        let frames = drain(&mut video);
        assert_eq!(frames.len(), originals.len(), "{name}");
        for (k, f) in frames.iter().enumerate() {
            assert_eq!(f.origin.time.ns, k as i64 * 100_000_000, "{name} frame {k}");
        }
        let diff = mean_abs_diff(&frames[20].image, &originals[20]);
        assert!(diff < 8.0, "{name}: {diff} levels off");
        decoded += 1;
    }
    assert!(decoded >= 1, "no codec could be tried");
}
