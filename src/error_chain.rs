//! An error and its causes as one line for a person, the way every front end shows them.

use std::error::Error;

/// `err` and its causes joined by `: `, each said once. Many errors (ours and other crates')
/// end their own message with their cause and also return it from `source()`, so printing the
/// whole chain would say it twice (`x: No such file: No such file`); a cause the line already
/// ends with is left out.
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    let mut text = String::new();
    let mut next = Some(err);
    while let Some(cause) = next {
        let part = cause.to_string();
        if !part.is_empty() && !text.ends_with(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        next = cause.source();
    }
    text
}
