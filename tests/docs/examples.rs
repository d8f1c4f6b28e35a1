//! Every configuration example the book writes out (a ```toml block that
//! is not an `{{#include}}` of a real file) loads and validates as a config
//! file, through the same check `throttle-worker check-config` runs, with
//! no deprecated key in it: an example with a misspelt key, a rule the
//! limiter refuses or a key under its deprecated name fails here, not in
//! an operator's first deployment.

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};
use throttle_worker::config::load_from;
use throttle_worker::operator::{check_config, Output};

use super::{book_pages, repo};

/// The ```toml blocks of a page, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (event, range) in Parser::new(text).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info)))
                if info.split([',', ' ']).next() == Some("toml") =>
            {
                let line = text[..range.start].lines().count() + 1;
                current = Some((line, String::new()));
            }
            Event::Text(t) => {
                if let Some((_, body)) = current.as_mut() {
                    body.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(block) = current.take() {
                    out.push(block);
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_configuration_example_in_the_book_loads() {
    let dir = tempfile::tempdir().unwrap();
    // An example's `limits.file` names a path of its deployment: point it
    // at the repository's example limits instead.
    let limits = repo().join("config/limits.example.toml");
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in book_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(repo()).unwrap().display().to_string();
        for (line, body) in toml_blocks(&text) {
            if body.contains("{{#include") {
                continue;
            }
            let body: String = body
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("file = ") {
                        format!("file = {:?}", limits.display().to_string())
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            let file = dir.path().join(format!("example-{checked}.toml"));
            std::fs::write(&file, &body).unwrap();
            checked += 1;
            if let Err(e) = check_config(Some(&file), Output::Table) {
                let mut why = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    why.push_str(&format!(": {s}"));
                    source = s.source();
                }
                failures.push(format!("{name}:{line}: {why}"));
            } else if let Ok(loaded) = load_from(Some(&file), Vec::new()) {
                for d in &loaded.deprecations {
                    failures.push(format!(
                        "{name}:{line}: {} is deprecated: write {}",
                        d.old, d.new
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "configuration examples of the book that do not load:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 5, "only {checked} examples found");
}
