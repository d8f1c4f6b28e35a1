//! `throttle-worker completions SHELL` and `throttle-worker man DIR`: what
//! an operator installs so that the shell completes the commands and `man`
//! documents them, from the same clap definitions as `--help`.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_throttle-worker");

#[test]
fn completions_name_every_operator_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["limits", "dlq", "replay", "override", "check-config"] {
            assert!(script.contains(word), "{shell}: no {word:?} in the completions");
        }
    }
    // A shell clap does not know is refused, naming the ones it does.
    let out = Command::new(BIN).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bash") && err.contains("zsh"), "{err}");
}

#[test]
fn man_writes_a_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("man")
        .arg(dir.path().join("man1"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for page in [
        "throttle-worker.1",
        "throttle-worker-run.1",
        "throttle-worker-limits.1",
        "throttle-worker-limits-reset.1",
        "throttle-worker-dlq-replay.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join("man1").join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}: not roff");
    }
    let top = std::fs::read_to_string(dir.path().join("man1/throttle-worker.1")).unwrap();
    assert!(top.contains("throttle\\-worker\\-limits(1)"), "the top page lists its commands");
}
