//! What the config's unit tests share.

use std::io::Write;

/// A TOML file holding `contents`, removed when dropped.
pub(super) fn file(contents: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(contents.as_bytes()).unwrap();
    f
}
