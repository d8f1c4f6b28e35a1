//! Running the `throttle-worker` binary as an operator does.

use std::path::Path;
use std::process::{Command, Output};

/// `throttle-worker ARGS --config CONFIG`, to its end.
pub fn run(args: &[&str], config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run throttle-worker")
}

/// The standard output of a run that must have succeeded.
pub fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
