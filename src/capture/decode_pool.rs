//! A small pool of worker threads that decodes (or renders) frames ahead of the capture thread
//! and hands them back in the order they were asked for.
//!
//! One 1280×720 JPEG takes 13.6 ms to decode on the H200 machine, longer than the GPU's whole
//! frame step, so a single capture thread cannot feed the GPU. The pool keeps up to `depth` jobs
//! outstanding (the back-pressure: nothing is decoded further ahead than that), and a result
//! that finishes early waits in a reorder buffer until its predecessors are out. Nothing is
//! dropped; a job that panics comes back as an error naming it instead of hanging the stream.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

/// Why the pool could not deliver the next result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("{what} panicked: {message}")]
    Panicked { what: String, message: String },
    #[error("the {0} workers are gone")]
    WorkersGone(String),
}

/// Worker threads for a frame source: as many as leave room for the capture, inference and
/// window threads, at most 8 (decoding is memory-bound beyond that).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .saturating_sub(3)
        .clamp(1, 8)
}

/// Jobs of type `J` turned into `T` by `work` on worker threads, delivered in submission order.
pub struct OrderedPool<J, T> {
    name: String,
    jobs: Option<Sender<(u64, J)>>,
    /// The workers' end of `jobs`, kept to abandon queued jobs on drop.
    queued: Receiver<(u64, J)>,
    results: Receiver<(u64, Result<T, String>)>,
    workers: Vec<JoinHandle<()>>,
    /// Sequence number of the next job submitted, and of the next result handed out.
    next_job: u64,
    next_out: u64,
    /// Results that finished before their predecessors.
    parked: BTreeMap<u64, Result<T, String>>,
    depth: usize,
}

impl<J: Send + 'static, T: Send + 'static> OrderedPool<J, T> {
    /// `workers` threads named after `name`; at most `depth` jobs outstanding (at least one per
    /// worker).
    pub fn new(
        name: &str,
        workers: usize,
        depth: usize,
        work: impl Fn(J) -> T + Send + Sync + 'static,
    ) -> Result<Self, std::io::Error> {
        let workers_n = workers.max(1);
        let depth = depth.max(workers_n);
        let (jobs_tx, jobs_rx) = bounded::<(u64, J)>(depth);
        let (results_tx, results_rx) = unbounded();
        let work = Arc::new(work);
        let mut workers = Vec::with_capacity(workers_n);
        for i in 0..workers_n {
            let jobs = jobs_rx.clone();
            let results = results_tx.clone();
            let work = Arc::clone(&work);
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    for (seq, job) in jobs.iter() {
                        let out = catch_unwind(AssertUnwindSafe(|| work(job)))
                            .map_err(|p| panic_message(p.as_ref()));
                        if results.send((seq, out)).is_err() {
                            // The pool was dropped: nobody wants the rest.
                            return;
                        }
                    }
                })?;
            workers.push(handle);
        }
        Ok(Self {
            name: name.to_owned(),
            jobs: Some(jobs_tx),
            queued: jobs_rx,
            results: results_rx,
            workers,
            next_job: 0,
            next_out: 0,
            parked: BTreeMap::new(),
            depth,
        })
    }

    /// Jobs submitted and not yet handed out.
    pub fn outstanding(&self) -> usize {
        (self.next_job - self.next_out) as usize
    }

    /// Whether another job may be submitted without going past the pool's depth.
    pub fn has_room(&self) -> bool {
        self.outstanding() < self.depth
    }

    /// Queues a job. Callers keep to [`Self::has_room`]; past it this blocks until a worker
    /// takes a job.
    pub fn submit(&mut self, job: J) -> Result<(), PoolError> {
        let gone = || PoolError::WorkersGone(self.name.clone());
        let jobs = self.jobs.as_ref().ok_or_else(gone)?;
        jobs.send((self.next_job, job)).map_err(|_| gone())?;
        self.next_job += 1;
        Ok(())
    }

    /// Submits the jobs `next_job` gives while there is room (the source's look-ahead).
    pub fn fill(&mut self, mut next_job: impl FnMut() -> Option<J>) -> Result<(), PoolError> {
        while self.has_room() {
            let Some(job) = next_job() else {
                break;
            };
            self.submit(job)?;
        }
        Ok(())
    }

    /// The next result in submission order, waiting for it; `None` when nothing is outstanding.
    pub fn next_result(&mut self) -> Option<Result<T, PoolError>> {
        if self.outstanding() == 0 {
            return None;
        }
        let seq = self.next_out;
        loop {
            if let Some(done) = self.parked.remove(&seq) {
                self.next_out += 1;
                return Some(done.map_err(|message| PoolError::Panicked {
                    what: format!("{} job {seq}", self.name),
                    message,
                }));
            }
            match self.results.recv() {
                Ok((s, out)) => {
                    self.parked.insert(s, out);
                }
                Err(_) => {
                    self.next_out += 1;
                    return Some(Err(PoolError::WorkersGone(self.name.clone())));
                }
            }
        }
    }
}

impl<J, T> Drop for OrderedPool<J, T> {
    /// Workers finish the job in hand and exit; queued jobs are abandoned.
    fn drop(&mut self) {
        self.jobs = None;
        while self.queued.try_recv().is_ok() {}
        for w in self.workers.drain(..) {
            if w.join().is_err() {
                tracing::warn!("a {} worker panicked outside a job", self.name);
            }
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Later jobs finish first (they sleep less), yet come out in order.
    #[test]
    fn results_come_out_in_submission_order() {
        let mut pool = OrderedPool::new("test", 4, 8, |i: u64| {
            std::thread::sleep(Duration::from_millis(20 - i % 5 * 4));
            i * 10
        })
        .expect("pool");
        let mut out = Vec::new();
        let mut next = 0u64;
        while out.len() < 40 {
            while next < 40 && pool.has_room() {
                pool.submit(next).expect("submit");
                next += 1;
            }
            out.push(pool.next_result().expect("outstanding").expect("no panic"));
        }
        assert_eq!(out, (0..40).map(|i| i * 10).collect::<Vec<_>>());
        assert!(pool.next_result().is_none());
    }

    /// The pool never runs more than `depth` jobs ahead of what was taken out.
    #[test]
    fn back_pressure_bounds_the_work_ahead() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let started = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&started);
        let mut pool = OrderedPool::new("test", 3, 5, move |i: u64| {
            seen.fetch_add(1, Ordering::SeqCst);
            i
        })
        .expect("pool");
        let mut next = 0;
        while pool.has_room() {
            pool.submit(next).expect("submit");
            next += 1;
        }
        assert_eq!(pool.outstanding(), 5);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            started.load(Ordering::SeqCst),
            5,
            "only the submitted jobs ran"
        );
        assert_eq!(pool.next_result(), Some(Ok(0)));
        assert!(pool.has_room());
    }

    #[test]
    fn a_panicking_job_is_an_error_in_its_place() {
        let mut pool = OrderedPool::new("decode", 2, 4, |i: u32| {
            if i == 1 {
                panic!("bad frame {i}");
            }
            i
        })
        .expect("pool");
        for i in 0..3 {
            pool.submit(i).expect("submit");
        }
        assert_eq!(pool.next_result(), Some(Ok(0)));
        match pool.next_result() {
            Some(Err(PoolError::Panicked { message, .. })) => {
                assert!(message.contains("bad frame 1"), "{message}")
            }
            other => panic!("expected the panic, got {other:?}"),
        }
        assert_eq!(pool.next_result(), Some(Ok(2)));
    }

    /// Dropping a pool with jobs in flight returns (workers finish their job and exit).
    #[test]
    fn dropping_with_work_in_flight_returns() {
        let mut pool = OrderedPool::new("test", 2, 6, |i: u64| {
            std::thread::sleep(Duration::from_millis(10));
            i
        })
        .expect("pool");
        for i in 0..6 {
            pool.submit(i).expect("submit");
        }
        let clock = std::time::Instant::now();
        drop(pool);
        assert!(clock.elapsed() < Duration::from_secs(5));
    }
}
