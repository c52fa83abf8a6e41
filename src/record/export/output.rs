//! Where exports may write, and how: never onto an input, never over an existing file unless
//! asked (`--force`), and always through a temporary file renamed into place, so a failed or
//! interrupted export leaves the old file (or none), never half a file.
//!
//! Inputs are compared by canonical path and by file identity (device and inode), so a
//! symlink or a hard link to the session is caught as well as the path itself.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::record::RecordError;

/// The files a COLMAP export writes into its folder: a folder holding only these may be
/// replaced with `--force`; one holding anything else is not ours to delete.
/// (The three root text files are what exports before `sparse/0/` wrote.)
pub const COLMAP_ENTRIES: [&str; 5] = [
    "sparse",
    "images",
    "cameras.txt",
    "images.txt",
    "points3D.txt",
];

/// A file's identity, which survives symlinks and hard links: device and inode on Unix, the
/// canonical path elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    #[cfg(unix)]
    dev_ino: (u64, u64),
    #[cfg(not(unix))]
    canonical: PathBuf,
}

fn identity(path: &Path) -> Option<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Identity {
            dev_ino: (meta.dev(), meta.ino()),
        })
    }
    #[cfg(not(unix))]
    Some(Identity {
        canonical: path.canonicalize().ok()?,
    })
}

/// An absolute, symlink-free spelling of a path that may not exist yet: its nearest existing
/// ancestor canonicalised, the rest appended.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            return rest.iter().rev().fold(c, |p: PathBuf, part| p.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// What an output is, for the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    File,
    /// A COLMAP model's folder.
    ColmapDir,
    /// A nerfstudio dataset's folder (`transforms.json`, `images/`).
    NerfstudioDir,
    /// A folder of depth and confidence maps.
    DepthDir,
}

/// What a nerfstudio export writes into its folder.
pub const NERFSTUDIO_ENTRIES: [&str; 2] = ["transforms.json", "images"];

impl OutputKind {
    /// The names an export of this kind writes into its folder (none for a file); a folder
    /// holding only these may be replaced with `--force`.
    fn entries(self) -> Option<&'static [&'static str]> {
        match self {
            OutputKind::File => None,
            OutputKind::ColmapDir => Some(&COLMAP_ENTRIES),
            OutputKind::NerfstudioDir => Some(&NERFSTUDIO_ENTRIES),
            OutputKind::DepthDir => Some(&[]),
        }
    }

    fn what(self) -> &'static str {
        match self {
            OutputKind::File => "file",
            OutputKind::ColmapDir => "COLMAP model",
            OutputKind::NerfstudioDir => "nerfstudio dataset",
            OutputKind::DepthDir => "depth export",
        }
    }
}

/// The outputs of one export, checked against its inputs and each other before anything is
/// written.
#[derive(Debug)]
pub struct OutputPlan {
    inputs: Vec<(PathBuf, Option<Identity>)>,
    claimed: Vec<(String, PathBuf)>,
    force: bool,
}

impl OutputPlan {
    /// `inputs`: every file the export reads. `force`: existing outputs may be replaced.
    pub fn new(inputs: &[&Path], force: bool) -> Self {
        Self {
            inputs: inputs.iter().map(|p| (resolved(p), identity(p))).collect(),
            claimed: Vec::new(),
            force,
        }
    }

    /// Checks one output; `flag` names it in messages (`--ply`).
    pub fn claim(&mut self, flag: &str, path: &Path, kind: OutputKind) -> Result<(), RecordError> {
        let refuse = |what: String| RecordError::Output {
            flag: flag.to_string(),
            path: path.to_path_buf(),
            what,
        };
        let target = resolved(path);
        let target_id = identity(path);
        for (input, input_id) in &self.inputs {
            let same_file = target_id.is_some() && target_id == *input_id;
            if same_file || target == *input {
                return Err(refuse(format!(
                    "is the session being exported ({}); an export never writes onto its input",
                    input.display()
                )));
            }
            if kind != OutputKind::File && input.starts_with(&target) {
                return Err(refuse(format!(
                    "holds the session being exported ({}); choose another folder",
                    input.display()
                )));
            }
        }
        for (other_flag, other) in &self.claimed {
            if target == *other || target.starts_with(other) || other.starts_with(&target) {
                return Err(refuse(format!(
                    "overlaps {other_flag} {}; give each output its own path",
                    other.display()
                )));
            }
        }
        match kind {
            OutputKind::File => {
                if target.is_dir() {
                    return Err(refuse("is a folder; give a file name".into()));
                }
                if target.exists() && !self.force {
                    return Err(refuse(
                        "exists; pass --force to replace it (it is never overwritten otherwise)"
                            .into(),
                    ));
                }
            }
            OutputKind::ColmapDir | OutputKind::NerfstudioDir | OutputKind::DepthDir => {
                if target.exists() && !target.is_dir() {
                    return Err(refuse("exists and is not a folder".into()));
                }
                let entries = dir_entries(&target).map_err(|e| RecordError::io(path, e))?;
                if !entries.is_empty() && !self.force {
                    return Err(refuse(format!(
                        "holds files; pass --force to replace the {} in it",
                        kind.what()
                    )));
                }
                let ours = kind.entries().unwrap_or_default();
                let is_ours = |n: &String| {
                    ours.contains(&n.as_str())
                        || (kind == OutputKind::DepthDir && is_depth_entry(n))
                };
                if let Some(foreign) = entries.iter().find(|n| !is_ours(n)) {
                    return Err(refuse(format!(
                        "holds `{foreign}`, which a {what} export does not write; not replacing \
                         a folder that is not a {what}",
                        what = kind.what()
                    )));
                }
            }
        }
        self.claimed.push((flag.to_string(), target));
        Ok(())
    }
}

/// What a depth export writes: `depth.json` and the maps' PNGs.
fn is_depth_entry(name: &str) -> bool {
    name == "depth.json"
        || [
            ".depth.png",
            ".confidence.png",
            ".depth.npy",
            ".confidence.npy",
        ]
        .iter()
        .any(|ext| name.ends_with(ext))
}

/// The names in a folder (none when it does not exist).
fn dir_entries(dir: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Creates the folders above `path` that are missing.
pub(crate) fn create_parent(path: &Path) -> Result<PathBuf, RecordError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| RecordError::io(&parent, e))?;
    Ok(parent)
}

fn temp_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(".{name}.")
}

/// Writes `path` through a temporary file beside it, renamed into place once complete and
/// synced; every I/O error names the file. Missing parent folders are created.
pub(crate) fn write_file(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), RecordError> {
    write_via_temp(path, true, body)
}

/// [`write_file`] without the sync: for many small files written as a run goes (a frame's
/// JSON), where a sync each would slow the run and the rename still keeps them whole.
pub(crate) fn write_file_unsynced(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), RecordError> {
    write_via_temp(path, false, body)
}

fn write_via_temp(
    path: &Path,
    sync: bool,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), RecordError> {
    let parent = create_parent(path)?;
    let prefix = temp_prefix(path);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".part");
    like_a_plain_create(&mut builder, PLAIN_FILE_MODE);
    let temp = builder
        .tempfile_in(&parent)
        .map_err(|e| RecordError::io(path, e))?;
    let (file, temp_path) = temp.into_parts();
    let mut w = BufWriter::new(file);
    body(&mut w)
        .and_then(|()| w.flush())
        .map_err(|e| RecordError::io(path, e))?;
    let file = w
        .into_inner()
        .map_err(|e| RecordError::io(path, e.into_error()))?;
    if sync {
        file.sync_all().map_err(|e| RecordError::io(path, e))?;
    }
    temp_path
        .persist(path)
        .map_err(|e| RecordError::io(path, e.error))?;
    Ok(())
}

/// The modes `File::create` and `create_dir` ask for (the umask then narrows them).
const PLAIN_FILE_MODE: u32 = 0o666;
const PLAIN_DIR_MODE: u32 = 0o777;

/// A temporary file or folder is private to its owner (0600 / 0700) by default; what an export
/// renames into place must be what a plain create would have made, so the other tools and users
/// that a `File::create` would let read it can read it.
fn like_a_plain_create(builder: &mut tempfile::Builder<'_, '_>, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = (builder, mode);
}

/// Builds a folder's content in a temporary folder beside it, then swaps it into place: an
/// existing folder (already checked by [`OutputPlan::claim`]) is replaced whole, so no stale
/// file of an older export survives, and a failed export leaves the old folder as it was.
pub(crate) fn write_dir<T>(
    dir: &Path,
    body: impl FnOnce(&Path) -> Result<T, RecordError>,
) -> Result<T, RecordError> {
    let parent = create_parent(dir)?;
    let prefix = temp_prefix(dir);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".part");
    like_a_plain_create(&mut builder, PLAIN_DIR_MODE);
    let temp = builder
        .tempdir_in(&parent)
        .map_err(|e| RecordError::io(dir, e))?;
    let out = body(temp.path())?;
    let built = temp.keep();
    let old = if dir.exists() {
        let aside = tempfile::Builder::new()
            .prefix(&temp_prefix(dir))
            .suffix(".old")
            .tempdir_in(&parent)
            .map_err(|e| RecordError::io(dir, e))?
            .keep();
        // rename() replaces the empty placeholder made just above.
        std::fs::rename(dir, &aside).map_err(|e| RecordError::io(dir, e))?;
        Some(aside)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(&built, dir) {
        if let Some(aside) = &old {
            // Put the old model back; the error below is what the person needs to know.
            if let Err(back) = std::fs::rename(aside, dir) {
                tracing::error!("could not restore {}: {back}", dir.display());
            }
        }
        return Err(RecordError::io(dir, e));
    }
    if let Some(aside) = old {
        std::fs::remove_dir_all(&aside).map_err(|e| RecordError::io(&aside, e))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn exported_files_and_folders_get_the_modes_of_a_plain_create() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        let plain = dir.path().join("plain.txt");
        File::create(&plain).expect("create");
        let exported = dir.path().join("exported.txt");
        write_file(&exported, |w| w.write_all(b"x")).expect("write_file");
        assert_eq!(mode(&exported), mode(&plain));
        let plain_dir = dir.path().join("plain_dir");
        std::fs::create_dir(&plain_dir).expect("create_dir");
        let exported_dir = dir.path().join("exported_dir");
        write_dir(&exported_dir, |_| Ok(())).expect("write_dir");
        assert_eq!(mode(&exported_dir), mode(&plain_dir));
    }

    #[test]
    fn an_output_onto_the_input_is_refused_by_path_link_and_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("s.srec");
        std::fs::write(&input, b"session").expect("write");
        let hard = dir.path().join("hard.ply");
        std::fs::hard_link(&input, &hard).expect("link");
        for (path, force) in [(input.clone(), true), (hard, true)] {
            let mut plan = OutputPlan::new(&[&input], force);
            let err = plan
                .claim("--ply", &path, OutputKind::File)
                .expect_err("refused");
            assert!(
                err.to_string().contains("never writes onto its input"),
                "{err}"
            );
        }
        let mut plan = OutputPlan::new(&[&input], true);
        let err = plan
            .claim("--colmap", dir.path(), OutputKind::ColmapDir)
            .expect_err("holds the input");
        assert!(err.to_string().contains("holds the session"), "{err}");
        assert_eq!(std::fs::read(&input).expect("read"), b"session");
    }

    #[test]
    fn existing_outputs_need_force_and_outputs_do_not_overlap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("s.srec");
        let out = dir.path().join("cloud.ply");
        std::fs::write(&out, b"old").expect("write");
        let mut plan = OutputPlan::new(&[&input], false);
        let err = plan
            .claim("--ply", &out, OutputKind::File)
            .expect_err("exists");
        assert!(err.to_string().contains("--force"), "{err}");
        let mut plan = OutputPlan::new(&[&input], true);
        plan.claim("--ply", &out, OutputKind::File).expect("forced");
        let err = plan
            .claim("--glb", &out, OutputKind::File)
            .expect_err("twice");
        assert!(err.to_string().contains("overlaps --ply"), "{err}");
    }

    #[test]
    fn a_file_is_replaced_whole_or_not_at_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new/sub/out.txt");
        write_file(&path, |w| w.write_all(b"one")).expect("write");
        let failed = write_file(&path, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&path).expect("read"), b"one");
        let left: Vec<_> = std::fs::read_dir(path.parent().expect("parent"))
            .expect("list")
            .collect();
        assert_eq!(left.len(), 1, "the temporary file is removed");
    }
}
