//! The crate's top-level modules import one another without a cycle, and
//! those `lib.rs` calls leaves import no other module of the crate. Also
//! two boundaries of the layout: `anyhow` only at the binary's edge
//! (`main.rs`), and the reference model's test half (`limiter::testkit`)
//! only behind its gate.
//!
//! Read from the source, not from the compiler: every `crate::<module>`
//! path outside a comment (a `use`, or a path written inline) is an edge
//! from the file's top-level module to `<module>`. A cycle makes modules
//! impossible to read, test or move one at a time; the failure names it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub(super) type Graph = BTreeMap<String, BTreeSet<String>>;

pub(super) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a line of code names after `crate::`, including each of a
/// group's (`crate::{a, b::c}`).
fn named_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Top-level module → the top-level modules it imports.
fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str();
        let name = Path::new(first).file_stem().unwrap().to_string_lossy();
        if name != "lib" && name != "main" {
            modules.insert(name.into_owned());
        }
    }
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str();
        let from = Path::new(first)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if !modules.contains(&from) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let code = code.split(" //").next().unwrap_or(code);
            for to in named_modules(code) {
                if to != from && modules.contains(&to) {
                    graph.get_mut(&from).unwrap().insert(to);
                }
            }
        }
    }
    graph
}

/// Every cycle of `graph`: its strongly connected components of more than
/// one module (Tarjan's algorithm), each as its set of modules, in order.
/// A module that imports itself is no cycle here: edges from a module to
/// itself are never recorded.
pub(super) fn find_cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, node: &'a str) {
        let i = w.index.len();
        w.index.insert(node, i);
        w.low.insert(node, i);
        w.stack.push(node);
        w.on_stack.insert(node);
        let graph = w.graph;
        for next in graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !w.index.contains_key(next) {
                visit(w, next);
                let low = w.low[node].min(w.low[next]);
                w.low.insert(node, low);
            } else if w.on_stack.contains(next) {
                let low = w.low[node].min(w.index[next]);
                w.low.insert(node, low);
            }
        }
        if w.low[node] == w.index[node] {
            let mut component = BTreeSet::new();
            while let Some(m) = w.stack.pop() {
                w.on_stack.remove(m);
                component.insert(m.to_owned());
                if m == node {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let mut w = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !w.index.contains_key(node.as_str()) {
            visit(&mut w, node);
        }
    }
    w.found.sort();
    w.found
}

pub(super) fn picture(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, to)| {
            format!(
                "  {m} -> {}",
                to.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_top_level_modules_import_one_another_without_a_cycle() {
    let graph = import_graph();
    assert!(
        graph.len() >= 10,
        "the walk of src/ found too few modules: {graph:?}"
    );
    let cycles = find_cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import cycles among {:?}\nthe imports:\n{}",
        cycles,
        picture(&graph)
    );
}

#[test]
fn the_modules_lib_rs_calls_leaves_import_no_other() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("src/lib.rs");
    let graph = import_graph();
    // lib.rs's map: "//! - [`name`]: ... Leaf module." (the entry may run
    // over several lines).
    let mut leaves = Vec::new();
    for entry in lib.split("//! - [`").skip(1) {
        let name = entry.split('`').next().unwrap().to_owned();
        let text: String = entry
            .lines()
            .take_while(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let text = text.split("- [`").next().unwrap_or(&text);
        if text.contains("Leaf module") {
            leaves.push(name);
        }
    }
    assert!(
        leaves.contains(&"config".to_owned()),
        "lib.rs calls config a leaf: {leaves:?}"
    );
    for leaf in &leaves {
        let imports = graph
            .get(leaf)
            .unwrap_or_else(|| panic!("no module {leaf}"));
        assert!(
            imports.is_empty(),
            "lib.rs calls {leaf} a leaf module, but it imports {imports:?}"
        );
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        graph
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned());
        graph.entry(to.to_owned()).or_default();
    }
    let cycles = find_cycles(&graph);
    assert_eq!(cycles.len(), 1, "a -> b -> c -> a: {cycles:?}");
    assert_eq!(cycles[0].len(), 3, "{cycles:?}");
    graph.get_mut("c").unwrap().clear();
    assert_eq!(find_cycles(&graph), Vec::<BTreeSet<String>>::new());
    assert_eq!(
        named_modules("use crate::{config, job::Job}; let x = crate::limiter::X;"),
        vec!["config", "job", "limiter"]
    );
}

/// The tools (`dev`, built with the `dev-tools` feature only) sit on top:
/// no product module imports them, only `cli`, whose tool subcommands are
/// gated on the feature. Otherwise `--no-default-features`, the production
/// build, would not compile.
#[test]
fn no_product_module_imports_the_tools() {
    let graph = import_graph();
    assert!(graph.contains_key("dev"), "no module dev under src/");
    let importers: Vec<&String> = graph
        .iter()
        .filter(|(m, to)| *m != "cli" && to.contains("dev"))
        .map(|(m, _)| m)
        .collect();
    assert!(
        importers.is_empty(),
        "product modules import the dev tools: {importers:?}\nthe imports:\n{}",
        picture(&graph)
    );
}

/// Every non-comment line of `src/` that mentions `needle`, as
/// `path:line: text`, outside the files `allowed` says may.
fn mentions(needle: &str, allowed: impl Fn(&Path) -> bool) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        if allowed(rel) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if !code.starts_with("//") && code.contains(needle) {
                out.push(format!("src/{}:{}: {}", rel.display(), i + 1, code));
            }
        }
    }
    out
}

/// Library modules return typed errors (thiserror); `anyhow` is the
/// binary's, at its edge, where an error is printed with its causes.
#[test]
fn anyhow_is_used_by_main_rs_alone() {
    let found = mentions("anyhow", |f| f == Path::new("main.rs"));
    assert!(
        found.is_empty(),
        "anyhow outside main.rs (return a typed error instead):\n{}",
        found.join("\n")
    );
    assert!(
        !mentions("anyhow", |_| false).is_empty(),
        "the walk of src/ did not see main.rs's anyhow"
    );
}

/// The reference model's test half (`limiter::testkit`) is never part of
/// the product: outside the kit itself, unit tests (`tests.rs`) and the
/// gate in `limiter/mod.rs`, a line of `src/` names it only behind
/// `#[cfg(any(test, feature = "testkit"))]` (the gate, or the item right
/// under it). A product file that used it ungated would also fail `cargo
/// clippy --no-default-features`, which `scripts/test.sh` runs; this names
/// the line.
#[test]
fn only_tests_name_the_test_kit() {
    const GATE: &str = "cfg(any(test, feature = \"testkit\"))";
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let (mut found, mut gated) = (Vec::new(), 0);
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        if rel.starts_with("limiter/testkit")
            || rel == Path::new("limiter/mod.rs")
            || rel.file_name().is_some_and(|n| n == "tests.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let mut previous = "";
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") || code.is_empty() {
                continue;
            }
            if code.contains("testkit") {
                if code.contains(GATE) || previous.contains(GATE) {
                    gated += 1;
                } else {
                    found.push(format!("src/{}:{}: {code}", rel.display(), i + 1));
                }
            }
            previous = code;
        }
    }
    assert!(
        found.is_empty(),
        "product files name the test kit ungated (limiter::testkit is cfg(test) or the testkit feature only):\n{}",
        found.join("\n")
    );
    assert!(gated > 0, "the walk of src/ saw no gated field of the kit");
}

/// Each client crate has one importer, the module that owns that client
/// (STYLE.md: "only one module imports each client crate"): librdkafka is
/// kafka's, Redis the limiter's, HTTP calls the downstream's, the metrics
/// registry telemetry's. Tools (`dev/`) and unit-test files may use a
/// server crate to stand in for the world.
#[test]
fn each_client_crate_has_one_importer() {
    let owners: &[(&str, &[&str])] = &[
        ("rdkafka::", &["kafka/"]),
        ("redis::", &["limiter/"]),
        ("reqwest::", &["downstream/"]),
        ("prometheus_client::", &["telemetry/metrics.rs"]),
        (
            "axum::",
            &["telemetry/http.rs", "dev/", "downstream/tests.rs"],
        ),
        ("notify::", &["worker/reload.rs"]),
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for (krate, allowed) in owners {
                // A path that starts with the crate's name (not
                // `limiter::redis::`, a module of ours).
                let named = code.match_indices(krate).any(|(at, _)| {
                    !code[..at]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                });
                if !named {
                    continue;
                }
                seen.insert(*krate);
                if !allowed.iter().any(|a| rel.starts_with(a)) {
                    found.push(format!("src/{rel}:{}: {code}", i + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a client crate imported outside its owner:\n{}",
        found.join("\n")
    );
    assert_eq!(
        seen.len(),
        owners.len(),
        "the walk missed a crate: {seen:?}"
    );
}
