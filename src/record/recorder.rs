//! The recorder: a thread that appends `FrameResult`s to a session file. The producer (the
//! inference thread, or whatever relays its results) never waits for the disk: `offer` is a
//! `try_send` on a bounded queue, and a result that does not fit is counted, then written down
//! as a "fell behind" notice ahead of the next frame that is recorded, so nothing is dropped
//! silently. A write error stops the recording (the file keeps every record completed before
//! it) and is reported through `status`, while the producer goes on.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use crate::frame::FrameResult;
use crate::record::RecordError;
use crate::record::codec::Notice;
use crate::record::writer::{DEFAULT_JPEG_QUALITY, SessionWriter};

/// Where a session goes: a `Write` that can also be made durable.
pub trait SessionSink: Write + Send + 'static {
    /// Flushes and asks the OS to put the bytes on disk.
    fn sync(&mut self) -> io::Result<()>;
}

impl SessionSink for BufWriter<File> {
    fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        self.get_ref().sync_data()
    }
}

/// Any writer, with `sync` meaning only `flush` (buffers in tests, pipes).
pub struct FlushOnly<W>(pub W);

impl<W: Write> Write for FlushOnly<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write + Send + 'static> SessionSink for FlushOnly<W> {
    fn sync(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecorderOptions {
    /// Results waiting for the disk at most; more are counted as not recorded.
    pub queue: usize,
    /// How often the file is synced: a crash loses at most this much.
    pub sync_every: Duration,
    pub jpeg_quality: u8,
}

impl Default for RecorderOptions {
    fn default() -> Self {
        Self {
            queue: 32,
            sync_every: Duration::from_secs(1),
            jpeg_quality: DEFAULT_JPEG_QUALITY,
        }
    }
}

/// What `offer` did with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Queued,
    /// The queue was full: not recorded, counted, and noted in the file.
    FellBehind,
    /// Recording has stopped (a write error, or it was finished); see `status`.
    Stopped,
}

/// For the UI: how the recording is going.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecorderStatus {
    pub path: PathBuf,
    pub frames_recorded: u64,
    /// Results offered while the queue was full.
    pub results_not_recorded: u64,
    pub bytes_written: u64,
    /// Why recording stopped early, for a message to the person.
    pub error: Option<String>,
    /// It stopped because the disk (or the quota) is full.
    pub disk_full: bool,
}

enum Item {
    Frame(f64, Arc<FrameResult>),
    Notice(f64, String),
}

const NO_FRAME: u64 = u64::MAX;

#[derive(Default)]
struct Shared {
    /// Results not recorded since the last notice written.
    behind: AtomicU64,
    behind_first: AtomicU64,
    behind_last: AtomicU64,
    not_recorded: AtomicU64,
    recorded: AtomicU64,
    bytes: AtomicU64,
    stopped: AtomicBool,
    error: Mutex<Option<String>>,
    disk_full: AtomicBool,
}

pub struct SessionRecorder {
    path: PathBuf,
    tx: Option<Sender<Item>>,
    shared: Arc<Shared>,
    started: Instant,
    thread: Option<JoinHandle<()>>,
}

impl SessionRecorder {
    /// Creates `path` (which must not exist), writes and syncs the header, and starts the thread.
    pub fn create(
        path: impl AsRef<Path>,
        config: &serde_json::Value,
        options: RecorderOptions,
    ) -> Result<Self, RecordError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| RecordError::io(path, e))?;
        Self::with_sink(BufWriter::new(file), path, config, options)
    }

    /// Records into any sink; `path` is what messages call it.
    pub fn with_sink<S: SessionSink>(
        sink: S,
        path: impl Into<PathBuf>,
        config: &serde_json::Value,
        options: RecorderOptions,
    ) -> Result<Self, RecordError> {
        let path = path.into();
        let mut writer =
            SessionWriter::new(sink, &path, config)?.with_jpeg_quality(options.jpeg_quality);
        // A disk that is full or read-only says so now, before any frame is offered.
        let offset = writer.offset();
        writer
            .get_mut()
            .sync()
            .map_err(|source| RecordError::Write {
                path: path.clone(),
                offset,
                source,
            })?;
        let shared = Arc::new(Shared {
            behind_first: AtomicU64::new(NO_FRAME),
            bytes: AtomicU64::new(offset),
            ..Shared::default()
        });
        let (tx, rx) = bounded(options.queue.max(1));
        let thread_shared = shared.clone();
        let started = Instant::now();
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || record_loop(writer, rx, &thread_shared, options.sync_every, started))
            .map_err(|e| RecordError::io(&path, e))?;
        Ok(Self {
            path,
            tx: Some(tx),
            shared,
            started,
            thread: Some(thread),
        })
    }

    /// Hands a result to the recorder without waiting.
    pub fn offer(&self, result: Arc<FrameResult>) -> Offer {
        let frame = result.frame;
        let t = self.started.elapsed().as_secs_f64();
        match self.send(Item::Frame(t, result)) {
            Offer::FellBehind => {
                let s = &self.shared;
                // First/last are for the message; the count is what must be exact. Frames come
                // in stream order, so the smallest one behind is the first.
                s.behind_first.fetch_min(frame, Ordering::AcqRel);
                s.behind_last.store(frame, Ordering::Release);
                s.behind.fetch_add(1, Ordering::AcqRel);
                s.not_recorded.fetch_add(1, Ordering::AcqRel);
                Offer::FellBehind
            }
            other => other,
        }
    }

    /// Writes a notice into the file (e.g. "session reset: …"), without waiting.
    pub fn note(&self, message: impl Into<String>) -> Offer {
        let t = self.started.elapsed().as_secs_f64();
        self.send(Item::Notice(t, message.into()))
    }

    fn send(&self, item: Item) -> Offer {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Offer::Stopped;
        }
        let Some(tx) = &self.tx else {
            return Offer::Stopped;
        };
        match tx.try_send(item) {
            Ok(()) => Offer::Queued,
            Err(TrySendError::Full(_)) => Offer::FellBehind,
            Err(TrySendError::Disconnected(_)) => Offer::Stopped,
        }
    }

    pub fn status(&self) -> RecorderStatus {
        let s = &self.shared;
        RecorderStatus {
            path: self.path.clone(),
            frames_recorded: s.recorded.load(Ordering::Acquire),
            results_not_recorded: s.not_recorded.load(Ordering::Acquire),
            bytes_written: s.bytes.load(Ordering::Acquire),
            error: s.error.lock().map(|e| e.clone()).unwrap_or_default(),
            disk_full: s.disk_full.load(Ordering::Acquire),
        }
    }

    /// Writes what is queued, the index and the footer, syncs, and says how it went.
    pub fn finish(mut self) -> RecorderStatus {
        self.close();
        self.status()
    }

    fn close(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            self.shared.fail("the recorder thread panicked".into());
        }
    }
}

impl Drop for SessionRecorder {
    /// A recorder dropped without `finish` still closes its file properly.
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn fail(&self, message: String) {
        self.stopped.store(true, Ordering::Release);
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(message);
        }
    }

    /// The "fell behind" notice for the results counted since the last one, if any.
    fn take_behind(&self, t_s: f64) -> Option<Notice> {
        let n = self.behind.swap(0, Ordering::AcqRel);
        if n == 0 {
            return None;
        }
        let first = self.behind_first.swap(NO_FRAME, Ordering::AcqRel);
        let last = self.behind_last.load(Ordering::Acquire);
        Some(Notice {
            message: format!("recorder fell behind: {n} results not recorded"),
            results_not_recorded: n,
            first_frame: (first != NO_FRAME).then_some(first),
            last_frame: (first != NO_FRAME).then_some(last),
            t_s,
        })
    }
}

fn record_loop<S: SessionSink>(
    mut writer: SessionWriter<S>,
    rx: Receiver<Item>,
    shared: &Shared,
    sync_every: Duration,
    started: Instant,
) {
    let mut last_sync = Instant::now();
    let result = (|| -> Result<(), RecordError> {
        for item in rx.iter() {
            let t_s = match &item {
                Item::Frame(t, _) | Item::Notice(t, _) => *t,
            };
            if let Some(notice) = shared.take_behind(t_s) {
                writer.write_notice(&notice)?;
            }
            match item {
                Item::Frame(t, r) => match writer.write_frame(&r, t) {
                    Ok(()) => {
                        shared.recorded.fetch_add(1, Ordering::AcqRel);
                    }
                    // One frame that cannot be encoded is noted; the recording goes on.
                    Err(RecordError::Encode { what, frame, .. }) => {
                        writer.write_notice(&Notice {
                            message: format!("frame {frame} not recorded: {what}"),
                            results_not_recorded: 1,
                            first_frame: Some(frame),
                            last_frame: Some(frame),
                            t_s: t,
                        })?;
                        shared.not_recorded.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(e) => return Err(e),
                },
                Item::Notice(t, message) => writer.write_notice(&Notice {
                    message,
                    results_not_recorded: 0,
                    first_frame: None,
                    last_frame: None,
                    t_s: t,
                })?,
            }
            shared.bytes.store(writer.offset(), Ordering::Release);
            if last_sync.elapsed() >= sync_every {
                sync(&mut writer)?;
                last_sync = Instant::now();
            }
        }
        // Closed by the owner: account for the tail, then the index.
        if let Some(notice) = shared.take_behind(started.elapsed().as_secs_f64()) {
            writer.write_notice(&notice)?;
        }
        let path = writer.path().to_path_buf();
        let (mut sink, len) = writer.close()?;
        shared.bytes.store(len, Ordering::Release);
        sink.sync().map_err(|source| RecordError::Write {
            path,
            offset: shared.bytes.load(Ordering::Acquire),
            source,
        })?;
        Ok(())
    })();
    if let Err(e) = result {
        if e.is_disk_full() {
            shared.disk_full.store(true, Ordering::Release);
            let kept = shared.recorded.load(Ordering::Acquire);
            shared.fail(format!(
                "the disk is full: recording stopped; the file keeps the {kept} frames \
                 recorded before ({e})"
            ));
        } else {
            shared.fail(format!("recording stopped: {e}"));
        }
    }
    // Dropping `rx` here makes later offers answer `Stopped`.
}

fn sync<S: SessionSink>(writer: &mut SessionWriter<S>) -> Result<(), RecordError> {
    let offset = writer.offset();
    let path = writer.path().to_path_buf();
    writer
        .get_mut()
        .sync()
        .map_err(|source| RecordError::Write {
            path,
            offset,
            source,
        })
}
