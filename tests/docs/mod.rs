//! The book under `docs/` and the Markdown beside the code: its links hold
//! (`links`), and the reference pages generated from the code are the ones
//! the code generates today (`references`; `THROTTLE_DOCS_BLESS=1` rewrites
//! them).

mod examples;
mod links;
mod references;

pub(crate) use references::{config_rows, ConfigRow};

use std::path::{Path, PathBuf};

/// Top-level Markdown whose links are checked with the book's.
const TOP_LEVEL: [&str; 5] = [
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "BENCHMARKS.md",
    "deploy/README.md",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown page under `docs/src`, sorted.
fn book_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("docs/src"), &mut out);
    out.sort();
    out
}
