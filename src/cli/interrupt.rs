//! Ctrl-C (SIGINT), SIGTERM and SIGHUP end `run` and `view` the same clean way: the first one
//! asks the command to finish (recording index, summary, exports), a second quits at once.
//! `timeout`, systemd, docker and a closed terminal send SIGTERM or SIGHUP, not SIGINT.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

/// The signal that asked the command to stop, if one did.
#[derive(Debug, Clone, Default)]
pub struct Interrupted(Arc<AtomicI32>);

impl Interrupted {
    /// The name of the first signal received, `None` while none came.
    pub fn signal(&self) -> Option<&'static str> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            n => Some(signal_name(n)),
        }
    }
}

/// How a person knows the signal: Ctrl-C by its key, the others by name.
fn signal_name(signal: i32) -> &'static str {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        match signal {
            SIGINT => "Ctrl-C",
            SIGTERM => "SIGTERM",
            SIGHUP => "SIGHUP",
            _ => "a signal",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = signal;
        "Ctrl-C"
    }
}

/// Watches for SIGINT, SIGTERM and SIGHUP on a thread of its own. The first calls `stop`
/// with the signal's name (it must ask the command to finish, not block); a second exits at
/// once with 128 + the signal's number. When the handlers cannot be installed the command
/// still runs, and says that a signal will cut it off.
pub fn on_interrupt(what: &str, stop: impl Fn(&'static str) + Send + 'static) -> Interrupted {
    let interrupted = Interrupted::default();
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        use signal_hook::iterator::Signals;
        let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("a signal will end {what} without finishing it: {e}");
                return interrupted;
            }
        };
        let flag = Arc::clone(&interrupted.0);
        let spawned = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let name = signal_name(signal);
                    if flag
                        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err()
                    {
                        eprintln!("\n{name} again: quitting without finishing");
                        std::process::exit(128 + signal);
                    }
                    stop(name);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("a signal will end {what} without finishing it: {e}");
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (what, stop);
    }
    interrupted
}
