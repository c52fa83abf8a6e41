//! Subcommands: each parses its arguments into the library's configuration, calls the library
//! and prints what it returns. Each returns `anyhow::Result` because this is the edge of the
//! program where errors become messages for a person.

pub mod backend_choice;
pub mod bench;
pub mod bench_e2e;
pub mod bench_viewer;
pub mod cache_sim;
pub mod export;
pub mod interrupt;
pub mod model_source;
pub mod parity;
pub mod replay;
pub mod run;
mod run_output;
pub mod stream_args;
pub mod view;

/// An error with its causes on one line, for a person (see [`crate::error_chain::one_line`]).
pub fn error_text(err: &anyhow::Error) -> String {
    crate::error_chain::one_line(err.as_ref())
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;
    use crate::capture::{CorruptFilePolicy, ImageFolder};

    #[test]
    fn error_text_says_each_cause_once() {
        let err = ImageFolder::open(
            std::path::Path::new("no/such/folder"),
            CorruptFilePolicy::Skip,
        )
        .err()
        .expect("a missing folder is an error");
        let err = anyhow::Error::new(err).context("--input no/such/folder");
        let text = error_text(&err);
        assert!(
            text.starts_with("--input no/such/folder: no/such/folder: "),
            "{text}"
        );
        let io = std::fs::read_dir("no/such/folder")
            .expect_err("the folder does not exist")
            .to_string();
        assert_eq!(text.matches(&io).count(), 1, "{text}");
        // Causes that add something are all kept, in order.
        let chained = Err::<(), _>(anyhow::anyhow!("disk full"))
            .context("writing frame 3")
            .context("recording")
            .expect_err("an error");
        assert_eq!(
            error_text(&chained),
            "recording: writing frame 3: disk full"
        );
    }
}
