//! Subcommand implementations. `main.rs` parses; these run. Each returns `anyhow::Result` because
//! this is the edge of the program where errors become messages for a person.

pub mod backend_choice;
pub mod bench;
pub mod bench_e2e;
pub mod cache_sim;
pub mod export;
pub mod model_source;
pub mod parity;
pub mod replay;
pub mod run;
pub mod stream_args;
pub mod view;

/// An error with its causes on one line, for a person: what `{:#}` prints, without repeats.
/// Many errors (ours and other crates') end their own message with their cause and also return
/// it from `source()`, so `{:#}` would say it twice (`x: No such file: No such file`); a cause
/// the line already ends with is left out.
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// What a subcommand that a later piece of work fills in says, so it never pretends to work.
pub fn not_yet(command: &str, what: &str) -> anyhow::Result<()> {
    anyhow::bail!("`streamrecon {command}` is not implemented yet: {what}. Nothing was done.")
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
