//! Every relative link of the book and of the top-level Markdown files
//! reaches a file that exists, and every `#anchor` a heading of it, as
//! mdbook and GitHub spell heading ids. `mdbook build` (in `.ci/run`) checks
//! the includes and SUMMARY.md's entries; it does not look at links, and a
//! page moved or a heading renamed would otherwise break them silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::{book_pages, repo, TOP_LEVEL};

/// A link as written, and where.
struct Link {
    from: PathBuf,
    dest: String,
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_HEADING_ATTRIBUTES | Options::ENABLE_FOOTNOTES
}

/// mdbook's heading id (`normalize_id`; GitHub's agrees for what we write):
/// lowercase, whitespace to `-`, every character but letters, digits, `-`
/// and `_` dropped.
fn heading_id(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The ids of a page's headings (a repeated one gets `-1`, `-2`, as in
/// mdbook), and its links.
fn read(path: &Path) -> (BTreeSet<String>, Vec<Link>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut ids = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<(String, Option<String>)> = None;
    for event in Parser::new_ext(&text, options()) {
        match event {
            Event::Start(Tag::Heading { id, level, .. }) => {
                let _: HeadingLevel = level;
                heading = Some((String::new(), id.map(|i| i.to_string())));
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((h, _)) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let (text, explicit) = heading.take().expect("a heading ends after it starts");
                let id = explicit.unwrap_or_else(|| heading_id(&text));
                let n = seen.entry(id.clone()).or_default();
                ids.insert(if *n == 0 {
                    id.clone()
                } else {
                    format!("{id}-{n}")
                });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                links.push(Link {
                    from: path.to_owned(),
                    dest: dest_url.to_string(),
                });
            }
            _ => {}
        }
    }
    (ids, links)
}

/// The files whose links are checked: the book's pages and the top-level
/// Markdown.
fn checked_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = TOP_LEVEL.iter().map(|f| repo().join(f)).collect();
    files.extend(book_pages());
    files
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let root = repo();
    let book = root.join("docs/src");
    let mut broken = Vec::new();
    let mut ids_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut links = Vec::new();
    for file in checked_files() {
        let (ids, l) = read(&file);
        ids_of.insert(file.canonicalize().unwrap(), ids);
        links.extend(l);
    }
    let mut checked = 0;
    for link in &links {
        let dest = link.dest.as_str();
        if dest.contains("://") || dest.starts_with("mailto:") {
            continue;
        }
        checked += 1;
        let (path, anchor) = match dest.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (dest, None),
        };
        let from = link.from.strip_prefix(&root).unwrap().display().to_string();
        let target = if path.is_empty() {
            link.from.clone()
        } else {
            link.from.parent().unwrap().join(path)
        };
        let Ok(target) = target.canonicalize() else {
            broken.push(format!("{from}: {dest}: no such file"));
            continue;
        };
        // The book is built from docs/src alone: a page that links out of
        // it works on GitHub and 404s in the built book.
        if link.from.starts_with(&book) && !target.starts_with(book.canonicalize().unwrap()) {
            broken.push(format!(
                "{from}: {dest}: leaves docs/src (the built book has only its pages: use {{{{#include}}}} or a full URL)"
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        let ids = match ids_of.get(&target) {
            Some(ids) => ids.clone(),
            None if target.extension().is_some_and(|e| e == "md") => read(&target).0,
            None => {
                broken.push(format!(
                    "{from}: {dest}: an anchor into a file that is not Markdown"
                ));
                continue;
            }
        };
        if !ids.contains(anchor) {
            broken.push(format!(
                "{from}: {dest}: no heading with id {anchor:?} in {}",
                target
                    .strip_prefix(root.canonicalize().unwrap())
                    .unwrap_or(&target)
                    .display()
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        checked >= 50,
        "only {checked} relative links checked: is the book there?"
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary_and_every_include_exists() {
    let root = repo();
    let src = root.join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let mut listed = BTreeSet::new();
    for event in Parser::new_ext(&summary, options()) {
        if let Event::Start(Tag::Link { dest_url, .. }) = event {
            listed.insert(src.join(dest_url.as_ref()));
        }
    }
    let mut problems = Vec::new();
    for page in book_pages() {
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        if page.file_name().is_some_and(|n| n != "SUMMARY.md") && !listed.contains(&page) {
            problems.push(format!(
                "{name}: not in SUMMARY.md (mdbook would not build it)"
            ));
        }
        let text = std::fs::read_to_string(&page).unwrap();
        for include in text.split("{{#include ").skip(1) {
            let Some(target) = include.split("}}").next() else {
                continue;
            };
            // `path:anchor` or `path:from:to`.
            let file = target.trim().split(':').next().unwrap();
            if !page.parent().unwrap().join(file).is_file() {
                problems.push(format!("{name}: {{{{#include {target}}}}}: no such file"));
            }
        }
    }
    for page in &listed {
        if !page.is_file() {
            problems.push(format!(
                "SUMMARY.md lists {} which does not exist",
                page.display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn heading_ids_follow_mdbook() {
    assert_eq!(heading_id("Redis data loss"), "redis-data-loss");
    assert_eq!(
        heading_id("Calls in flight per seller (`max_in_flight`)"),
        "calls-in-flight-per-seller-max_in_flight"
    );
    assert_eq!(heading_id("What 1.5× means"), "what-15-means");
}
