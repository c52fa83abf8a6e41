//! The recorder thread: never blocks the producer, says when it fell behind, stops cleanly on a
//! write error (an injected one and, where it exists, /dev/full), and records while another
//! session replays.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use streamrecon::record::sample::sample_result;
use streamrecon::record::{
    FlushOnly, Offer, Parts, Player, RecordError, RecorderOptions, ReplayOptions, SessionReader,
    SessionRecorder,
};

fn config() -> serde_json::Value {
    serde_json::json!({ "test": true })
}

/// A shared buffer, so the test can read what reached the "disk".
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

/// Accepts `limit` bytes, then fails like a full disk (part of the last write goes through).
struct FullAfter {
    buf: SharedBuf,
    limit: usize,
}

impl Write for FullAfter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut buf = self.buf.0.lock().unwrap();
        let room = self.limit.saturating_sub(buf.len());
        if room == 0 {
            return Err(io::Error::from_raw_os_error(28));
        }
        let n = room.min(data.len());
        buf.extend_from_slice(&data[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A slow disk.
/// Shut, a disk takes no writes: whoever writes waits until it opens.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn set_shut(&self, shut: bool) {
        *self.0.0.lock().unwrap() = shut;
        self.0.1.notify_all();
    }
    fn wait_open(&self) {
        let mut shut = self.0.0.lock().unwrap();
        while *shut {
            shut = self.0.1.wait(shut).unwrap();
        }
    }
}

/// A disk that stalls while its gate is shut.
struct Stalling {
    buf: SharedBuf,
    gate: Gate,
}

impl Write for Stalling {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.gate.wait_open();
        self.buf.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn records_to_a_file_and_closes_with_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.srec");
    let rec = SessionRecorder::create(&path, &config(), RecorderOptions::default()).unwrap();
    for i in 0..6 {
        assert_eq!(
            rec.offer(Arc::new(sample_result(i, 16, 12, 30))),
            Offer::Queued
        );
    }
    assert_eq!(rec.note("session reset: test"), Offer::Queued);
    let status = rec.finish();
    assert_eq!(status.error, None);
    assert_eq!(status.frames_recorded, 6);
    assert_eq!(status.results_not_recorded, 0);
    assert_eq!(
        status.bytes_written,
        std::fs::metadata(&path).unwrap().len()
    );
    let reader = SessionReader::open(&path).unwrap();
    assert!(reader.indexed());
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    assert_eq!(reader.frames().len(), 6);
    assert_eq!(reader.notices()[0].message, "session reset: test");
    assert_eq!(reader.config(), &config());
    // Times are monotonic seconds since the start.
    let t: Vec<f64> = reader.frames().iter().map(|f| f.t_s).collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]) && t[0] >= 0.0, "{t:?}");
    // An existing file is never overwritten.
    let again = SessionRecorder::create(&path, &config(), RecorderOptions::default());
    assert!(again.is_err());
}

#[test]
fn a_slow_disk_never_blocks_the_producer_and_every_result_is_accounted_for() {
    let buf = SharedBuf::default();
    let gate = Gate::default();
    let sink = FlushOnly(Stalling {
        buf: buf.clone(),
        gate: gate.clone(),
    });
    let options = RecorderOptions {
        queue: 2,
        sync_every: Duration::ZERO,
        ..RecorderOptions::default()
    };
    let rec = Arc::new(SessionRecorder::with_sink(sink, "slow.srec", &config(), options).unwrap());
    // The disk stalls from here on: an offer that waited for it would never return.
    gate.set_shut(true);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let producer = Arc::clone(&rec);
    std::thread::spawn(move || {
        let behind = (0..40)
            .filter(|&i| producer.offer(Arc::new(sample_result(i, 8, 6, 5))) == Offer::FellBehind)
            .count() as u64;
        // Given back before the answer, so the test holds the only handle when it hears it.
        drop(producer);
        if done_tx.send(behind).is_err() {
            eprintln!("the offers returned after the test stopped waiting (it has failed)");
        }
    });
    let offered = done_rx.recv_timeout(Duration::from_secs(20));
    gate.set_shut(false);
    let behind = offered.expect("every offer returned while the disk stalled");
    let rec = Arc::into_inner(rec).expect("the producer is done with the recorder");
    assert!(behind > 0, "the queue of 2 never filled");
    assert_eq!(rec.status().results_not_recorded, behind);
    let status = rec.finish();
    assert_eq!(status.error, None);
    assert_eq!(status.frames_recorded + behind, 40);
    let reader = SessionReader::from_bytes("slow.srec", buf.bytes()).unwrap();
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    assert_eq!(reader.frames().len() as u64, status.frames_recorded);
    let noted: u64 = reader
        .notices()
        .iter()
        .map(|n| n.results_not_recorded)
        .sum();
    assert_eq!(
        noted, behind,
        "every result not recorded is noted in the file"
    );
    assert!(
        reader
            .notices()
            .iter()
            .all(|n| n.message.contains("fell behind"))
    );
}

#[test]
fn a_full_disk_stops_recording_with_a_clear_message_and_keeps_the_prefix() {
    let buf = SharedBuf::default();
    // Room for the header and about two and a half frames.
    let frame_bytes = {
        let mut w =
            streamrecon::record::SessionWriter::new(Vec::new(), "probe", &config()).unwrap();
        let start = w.offset();
        w.write_frame(&sample_result(0, 16, 12, 20), 0.0).unwrap();
        (start, w.offset() - start)
    };
    let limit = (frame_bytes.0 + frame_bytes.1 * 5 / 2) as usize;
    let sink = FlushOnly(FullAfter {
        buf: buf.clone(),
        limit,
    });
    let options = RecorderOptions {
        queue: 64,
        sync_every: Duration::ZERO,
        ..RecorderOptions::default()
    };
    let rec = SessionRecorder::with_sink(sink, "full.srec", &config(), options).unwrap();
    for i in 0..10 {
        // The producer goes on whatever the recorder says.
        rec.offer(Arc::new(sample_result(i, 16, 12, 20)));
    }
    let error = wait_for(|| rec.status().error);
    assert!(error.contains("full.srec"), "{error}");
    assert!(
        error.contains("No space left") || error.contains("os error 28"),
        "{error}"
    );
    assert_eq!(
        rec.offer(Arc::new(sample_result(99, 16, 12, 20))),
        Offer::Stopped
    );
    let status = rec.finish();
    assert_eq!(status.frames_recorded, 2);
    // What reached the disk reads back: two complete frames, a cut-short third.
    let reader = SessionReader::from_bytes("full.srec", buf.bytes()).unwrap();
    let complete = reader.frames().iter().filter(|f| f.complete).count();
    assert_eq!(complete, 2);
    assert_eq!(reader.issues().len(), 1, "{:?}", reader.issues());
}

#[test]
fn dev_full_is_refused_at_creation() {
    let path = std::path::Path::new("/dev/full");
    if !path.exists() {
        eprintln!("skipped: no /dev/full on this system");
        return;
    }
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let err = SessionRecorder::with_sink(
        io::BufWriter::new(file),
        path,
        &config(),
        RecorderOptions::default(),
    )
    .err()
    .expect("/dev/full accepts nothing");
    assert!(matches!(err, RecordError::Write { .. }), "{err}");
    assert!(err.to_string().contains("/dev/full"), "{err}");
}

#[test]
fn records_one_session_while_replaying_another() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.srec");
    let b = dir.path().join("b.srec");
    {
        let rec = SessionRecorder::create(&a, &config(), RecorderOptions::default()).unwrap();
        for i in 0..8 {
            rec.offer(Arc::new(sample_result(i, 16, 12, 25)));
        }
        assert_eq!(rec.finish().frames_recorded, 8);
    }
    let source = Arc::new(SessionReader::open(&a).unwrap());
    let recorder = SessionRecorder::create(&b, &config(), RecorderOptions::default()).unwrap();
    let mut player = Player::new(
        source.clone(),
        ReplayOptions {
            speed: 0.0,
            ..ReplayOptions::default()
        },
        Instant::now(),
    );
    let mut replayed = Vec::new();
    while let Some(frame) = player.next_frame(Parts::ALL) {
        let frame = frame.unwrap();
        assert_eq!(recorder.offer(frame.clone()), Offer::Queued);
        replayed.push(frame);
    }
    assert_eq!(recorder.finish().frames_recorded, 8);
    let copy = SessionReader::open(&b).unwrap();
    assert!(copy.issues().is_empty());
    assert_eq!(copy.frames().len(), 8);
    for (i, original) in replayed.iter().enumerate() {
        let got = copy.read_frame(i, Parts::GEOMETRY).unwrap();
        assert_eq!(got.points, original.points);
        assert_eq!(got.world_from_camera, original.world_from_camera);
        assert_eq!(got.cache, original.cache);
        assert_eq!(got.timings, original.timings);
    }
}

#[test]
fn the_player_keeps_the_recorded_pace_and_pauses() {
    let mut w = streamrecon::record::SessionWriter::new(Vec::new(), "p", &config()).unwrap();
    for i in 0..4 {
        w.write_frame(&sample_result(i, 4, 4, 1), i as f64 * 0.5)
            .unwrap();
    }
    let reader = Arc::new(SessionReader::from_bytes("p", w.finish().unwrap()).unwrap());
    let t0 = Instant::now();
    let mut p = Player::new(
        reader,
        ReplayOptions {
            speed: 2.0,
            from_frame: Some(1),
            to_frame: Some(3),
        },
        t0,
    );
    assert_eq!(p.len(), 3);
    assert_eq!(p.wait(t0), Some(Duration::ZERO));
    assert_eq!(p.next_frame(Parts::GEOMETRY).unwrap().unwrap().frame, 1);
    // Frame 2 was recorded 0.5 s later; at double speed it is due 0.25 s after the start.
    assert_eq!(p.wait(t0), Some(Duration::from_millis(250)));
    p.pause(t0 + Duration::from_millis(100));
    assert_eq!(p.wait(t0 + Duration::from_secs(5)), None);
    p.resume(t0 + Duration::from_millis(1100));
    assert_eq!(
        p.wait(t0 + Duration::from_millis(1100)),
        Some(Duration::from_millis(150))
    );
    p.next_frame(Parts::GEOMETRY);
    p.next_frame(Parts::GEOMETRY);
    assert!(p.is_finished());
    assert_eq!(p.wait(t0), None);
}

#[test]
fn the_player_seeks_by_stream_frame() {
    let mut w = streamrecon::record::SessionWriter::new(Vec::new(), "s", &config()).unwrap();
    for i in 0..6 {
        w.write_frame(&sample_result(i * 2, 4, 4, 1), i as f64)
            .unwrap();
    }
    let reader = Arc::new(SessionReader::from_bytes("s", w.finish().unwrap()).unwrap());
    let t0 = Instant::now();
    let mut p = Player::new(reader, ReplayOptions::default(), t0);
    // Stream frames 0, 2, ..., 10; frame 5 is not there, so the seek lands on 6.
    p.seek_to_frame(5, t0);
    assert_eq!(p.position(), 3);
    assert_eq!(p.catch_up_to(5), 0..3);
    assert_eq!(p.frame_at(1, Parts::GEOMETRY).unwrap().unwrap().frame, 2);
    assert_eq!(p.wait(t0), Some(Duration::ZERO));
    assert_eq!(p.next_frame(Parts::GEOMETRY).unwrap().unwrap().frame, 6);
    // The next one is one recorded second later.
    assert_eq!(p.wait(t0), Some(Duration::from_secs(1)));
    p.seek_to_frame(99, t0);
    assert!(p.is_finished());
}
