//! Inside every module, its child modules import one another without a
//! cycle: `worker/`'s engine imports its components, the components never
//! the engine; `limiter/`'s store never its callers; and so on, at every
//! depth. The top-level check (`module_graph.rs`) sees only edges between
//! `src/`'s own modules; a cycle between two files of one directory hides
//! from it.
//!
//! Read from the source: every path written from `crate::`, `super::` or
//! `self::` (a `use`, or inline), `{}` groups expanded, is resolved against
//! the file's own module. Where the importing module and the imported path
//! part ways, under their deepest common module `D`, the child of `D` on
//! the importer's side imports the child of `D` on the other side. A child
//! naming its parent's own items (`super::Engine`) is no edge: a module's
//! children read what it declares. But an item the parent only re-exports
//! (`pub use engine::Engine;` in `worker/mod.rs`) is followed to the file
//! that defines it: `super::Engine` from `worker::scheduler` is an import
//! of `worker::engine`, else a cycle through a re-export would hide.
//!
//! Every cycle is found (the strongly connected components of each graph,
//! not the first cycle a walk meets), and [`KNOWN`] names each allowed one
//! by its exact set of modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::module_graph::{find_cycles, picture, rust_files, Graph};

type ModPath = Vec<String>;

/// A file's module: `worker/engine/ask.rs` is `worker::engine::ask`,
/// `worker/engine/mod.rs` is `worker::engine`, `lib.rs` the crate.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The items of a `{}` group at the start of `s` (after the brace), split
/// at its top-level commas, and what follows the group.
fn group(s: &str) -> (Vec<&str>, &str) {
    let (mut depth, mut start, mut items) = (0usize, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&s[start..i]);
                return (items, &s[i + 1..]);
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&s[start..]);
    (items, "")
}

/// The paths a path expression at the start of `s` names, each as its
/// segments, over every item of its groups.
fn expand(s: &str) -> Vec<ModPath> {
    let (first, rest) = ident(s.trim_start());
    if first.is_empty() {
        return Vec::new();
    }
    let Some(rest) = rest.strip_prefix("::") else {
        return vec![vec![first.to_owned()]];
    };
    let tails = match rest.strip_prefix('{') {
        Some(g) => group(g).0.into_iter().flat_map(expand).collect(),
        None => expand(rest),
    };
    if tails.is_empty() {
        return vec![vec![first.to_owned()]];
    }
    tails
        .into_iter()
        .map(|mut t| {
            t.insert(0, first.to_owned());
            t
        })
        .collect()
}

/// Every path `code` writes from `crate::`, `super::` or `self::`.
fn named_paths(code: &str) -> Vec<ModPath> {
    let mut out = Vec::new();
    for (i, _) in code.char_indices() {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i..];
        if ["crate::", "super::", "self::"]
            .iter()
            .any(|p| rest.starts_with(p))
        {
            out.extend(expand(rest));
        }
    }
    out
}

/// `path` as written in `module`, made absolute.
fn resolve(module: &[String], path: &[String]) -> ModPath {
    let mut out: ModPath = module.to_vec();
    for (i, seg) in path.iter().enumerate() {
        match seg.as_str() {
            "crate" if i == 0 => out.clear(),
            "super" => {
                out.pop();
            }
            "self" => {}
            other => out.push(other.to_owned()),
        }
    }
    out
}

/// Every `pub use` (of any visibility) in `code`, the code of `module`:
/// the name it makes visible in `module` and the absolute path it names.
/// A path that is neither `crate::`, `super::`, `self::` nor a child
/// module of `module` names another crate and is left out; so are globs.
fn reexports_of(
    module: &[String],
    code: &str,
    modules: &BTreeSet<ModPath>,
) -> Vec<(String, ModPath)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("pub") {
        let before = code[..code.len() - rest.len() + i].chars().next_back();
        rest = &rest[i + "pub".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut tail = rest.trim_start();
        if let Some(vis) = tail.strip_prefix('(') {
            let Some(end) = vis.find(')') else { continue };
            tail = vis[end + 1..].trim_start();
        }
        let Some(stmt) = tail.strip_prefix("use ") else {
            continue;
        };
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        for (path, name) in use_items(stmt) {
            let local = match path.first().map(String::as_str) {
                Some("crate" | "super" | "self") => true,
                Some(first) => {
                    let mut child = module.to_vec();
                    child.push(first.to_owned());
                    modules.contains(&child)
                }
                None => false,
            };
            if local && name != "*" && name != "self" {
                let mut path = path;
                if !matches!(path[0].as_str(), "crate" | "super" | "self") {
                    path.insert(0, "self".to_owned());
                }
                out.push((name, resolve(module, &path)));
            }
        }
    }
    out
}

/// The paths of a `use` tree (`a::{b as c, d::e}`), each with the name it
/// binds.
fn use_items(tree: &str) -> Vec<(ModPath, String)> {
    let tree = tree.trim();
    let (first, rest) = ident(tree);
    if first.is_empty() {
        return if tree.starts_with('*') {
            vec![(Vec::new(), "*".to_owned())]
        } else {
            Vec::new()
        };
    }
    let rest = rest.trim_start();
    if let Some(rest) = rest.strip_prefix("::") {
        let subs = match rest.trim_start().strip_prefix('{') {
            Some(g) => group(g).0.into_iter().flat_map(use_items).collect(),
            None => use_items(rest),
        };
        return subs
            .into_iter()
            .map(|(mut path, name)| {
                path.insert(0, first.to_owned());
                (path, name)
            })
            .collect();
    }
    let name = match rest.strip_prefix("as ") {
        Some(alias) => ident(alias.trim_start()).0.to_owned(),
        None => first.to_owned(),
    };
    vec![(vec![first.to_owned()], name)]
}

/// Re-exports: (module, name) → the path it stands for.
type Reexports = BTreeMap<(ModPath, String), ModPath>;

/// `path` with every re-exported step replaced by what it re-exports,
/// until it names a module, or an item of the module that defines it.
fn follow(mut path: ModPath, modules: &BTreeSet<ModPath>, reexports: &Reexports) -> ModPath {
    // A re-export of a re-export is followed too; the bound stops a loop
    // of them (which the compiler would refuse anyway).
    for _ in 0..16 {
        let mut changed = false;
        for i in 0..path.len() {
            let prefix = path[..i].to_vec();
            if i > 0 && !modules.contains(&prefix) {
                break;
            }
            if modules.contains(&path[..=i]) {
                continue;
            }
            if let Some(target) = reexports.get(&(prefix, path[i].clone())) {
                let mut next = target.clone();
                next.extend(path[i + 1..].iter().cloned());
                changed = next != path;
                path = next;
            }
            break;
        }
        if !changed {
            break;
        }
    }
    path
}

/// Each module's graph of its children (keyed by the module, `""` the
/// crate), from the source under `src`.
fn inner_graphs(src: &Path) -> BTreeMap<String, Graph> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules: BTreeSet<ModPath> = BTreeSet::new();
    for f in &files {
        let mut m = module_of(f.strip_prefix(src).unwrap());
        while !m.is_empty() {
            modules.insert(m.clone());
            m.pop();
        }
    }
    let code_of = |f: &Path| -> String {
        let text = std::fs::read_to_string(f).unwrap();
        text.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| l.split(" //").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut reexports = Reexports::new();
    for f in &files {
        let from = module_of(f.strip_prefix(src).unwrap());
        for (name, to) in reexports_of(&from, &code_of(f), &modules) {
            reexports.insert((from.clone(), name), to);
        }
    }
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    for f in &files {
        let from = module_of(f.strip_prefix(src).unwrap());
        let code = code_of(f);
        for path in named_paths(&code) {
            let to = follow(resolve(&from, &path), &modules, &reexports);
            let Some(k) = (0..from.len().min(to.len())).find(|&k| from[k] != to[k]) else {
                continue;
            };
            let parent = &from[..k];
            let mut child = parent.to_vec();
            child.push(to[k].clone());
            if !modules.contains(&child) {
                continue;
            }
            let graph = graphs.entry(parent.join("::")).or_default();
            graph.entry(to[k].clone()).or_default();
            graph
                .entry(from[k].clone())
                .or_default()
                .insert(to[k].clone());
        }
    }
    graphs
}

/// The cycles allowed for now, each as (the module whose children form
/// it, its exact set of children): none. The check fails for any cycle
/// not listed here, for a listed one that grew or shrank, and for a
/// listed one once it is gone, so the list only shrinks; it stays, empty,
/// for the next cycle that must be allowed for a time (see the note of
/// issue 34 and issue 51, items 4 and 8).
const KNOWN: &[(&str, &[&str])] = &[];

/// One cycle: the module whose children form it, and its children (a
/// strongly connected component of more than one of them).
type Cycle = (String, BTreeSet<String>);

fn cycles(graphs: &BTreeMap<String, Graph>) -> Vec<Cycle> {
    graphs
        .iter()
        .flat_map(|(module, graph)| {
            find_cycles(graph)
                .into_iter()
                .map(move |c| (module.clone(), c))
        })
        .collect()
}

/// A cycle as a failure names it, with the imports among its members.
fn describe((module, members): &Cycle, graphs: &BTreeMap<String, Graph>) -> String {
    let name = if module.is_empty() { "crate" } else { module };
    let inside: Graph = graphs[module]
        .iter()
        .filter(|(m, _)| members.contains(*m))
        .map(|(m, to)| (m.clone(), to.intersection(members).cloned().collect()))
        .collect();
    format!(
        "inside {name}: {{{}}}\nits imports among them:\n{}",
        members.iter().cloned().collect::<Vec<_>>().join(", "),
        picture(&inside)
    )
}

fn is_known((module, members): &Cycle) -> bool {
    KNOWN.iter().any(|(m, set)| {
        m == module && set.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>() == *members
    })
}

#[test]
fn the_modules_inside_every_module_import_one_another_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graphs = inner_graphs(&src);
    let worker = graphs.get("worker").expect("a graph of worker/'s modules");
    assert!(
        worker
            .get("engine")
            .is_some_and(|to| to.contains("scheduler")),
        "the walk did not see the engine import the scheduler:\n{}",
        picture(worker)
    );
    assert!(graphs.contains_key("worker::engine") || graphs.len() > 5);
    let found = cycles(&graphs);
    let new: Vec<String> = found
        .iter()
        .filter(|c| !is_known(c))
        .map(|c| describe(c, &graphs))
        .collect();
    assert!(
        new.is_empty(),
        "import cycles ({} of them):\n{}",
        new.len(),
        new.join("\n\n")
    );
    for (module, set) in KNOWN {
        let set: BTreeSet<String> = set.iter().map(|s| s.to_string()).collect();
        assert!(
            found.contains(&(module.to_string(), set.clone())),
            "{module} has no import cycle of exactly {set:?} any more: take it off KNOWN"
        );
    }
}

/// A cycle planted in a copy of `worker/` fails the check, named.
#[test]
fn a_planted_cycle_inside_a_module_is_found() {
    let dir = std::env::temp_dir().join(format!("inner-graph-{}", std::process::id()));
    let files = [
        ("lib.rs", "pub mod worker;"),
        ("worker/mod.rs", "mod engine; mod scheduler; mod pool;"),
        (
            "worker/engine/mod.rs",
            "mod ask;\nuse super::scheduler::Scheduler;",
        ),
        (
            "worker/engine/ask.rs",
            "use super::super::{pool::Slots, scheduler::Ready};\nuse super::Engine; // a parent's item",
        ),
        ("worker/pool.rs", "pub struct Slots;"),
        (
            "worker/scheduler.rs",
            "use crate::worker::pool::{self, Slots};\n// use super::engine::Engine;",
        ),
    ];
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let clean = inner_graphs(&dir);
    assert_eq!(cycles(&clean), Vec::<Cycle>::new(), "{clean:?}");
    let worker = &clean["worker"];
    assert!(worker["engine"].contains("scheduler") && worker["engine"].contains("pool"));
    assert!(worker["scheduler"].contains("pool"));
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
    // The scheduler now reaches back into the engine, inline.
    std::fs::write(
        dir.join("worker/scheduler.rs"),
        "use crate::worker::pool::Slots;\nfn f() -> super::engine::Engine { todo!() }",
    )
    .unwrap();
    let found = cycles(&inner_graphs(&dir));
    assert_eq!(
        found,
        vec![("worker".to_owned(), set(&["engine", "scheduler"]))]
    );
    assert!(
        describe(&found[0], &inner_graphs(&dir)).starts_with("inside worker: {engine, scheduler}"),
        "{}",
        describe(&found[0], &inner_graphs(&dir))
    );
    // A second cycle, elsewhere, through a re-export: `super::Link` is
    // `b`'s item, re-exported by `links`, so `a` imports `b`.
    for (path, text) in [
        ("lib.rs", "pub mod worker; pub mod links;"),
        ("links/mod.rs", "mod a; mod b;\npub use b::Link;"),
        ("links/a.rs", "use super::Link;\npub struct A;"),
        ("links/b.rs", "pub struct Link(crate::links::a::A);"),
    ] {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let found = cycles(&inner_graphs(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        vec![
            ("links".to_owned(), set(&["a", "b"])),
            ("worker".to_owned(), set(&["engine", "scheduler"])),
        ],
        "every cycle, the re-exported one too"
    );
}

/// Two cycles that share no module, and one of three, are each found
/// whole (the first walk found one cycle and stopped).
#[test]
fn every_cycle_is_found_whole() {
    let mut graph = Graph::new();
    for (from, to) in [
        ("a", "b"),
        ("b", "a"),
        ("c", "d"),
        ("d", "e"),
        ("e", "c"),
        ("f", "a"),
    ] {
        graph
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned());
        graph.entry(to.to_owned()).or_default();
    }
    let found = find_cycles(&graph);
    let sets: Vec<Vec<&str>> = found
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(sets, vec![vec!["a", "b"], vec!["c", "d", "e"]]);
}

#[test]
fn paths_resolve_from_their_module() {
    let m = |s: &str| -> ModPath { s.split("::").map(str::to_owned).collect() };
    assert_eq!(
        named_paths(
            "use super::super::{pool::Slots, scheduler::{self, Ready}}; crate::a::b(); self::c"
        ),
        vec![
            m("super::super::pool::Slots"),
            m("super::super::scheduler::self"),
            m("super::super::scheduler::Ready"),
            m("crate::a::b"),
            m("self::c"),
        ]
    );
    let ask = m("worker::engine::ask");
    assert_eq!(
        resolve(&ask, &m("super::super::pool::Slots")),
        m("worker::pool::Slots")
    );
    assert_eq!(
        resolve(&ask, &m("crate::limiter::Rule")),
        m("limiter::Rule")
    );
    assert_eq!(
        module_of(Path::new("worker/engine/mod.rs")),
        m("worker::engine")
    );
}

/// The limiter's layers (`src/limiter/mod.rs`, and the book's internals
/// page "How the code is laid out"), first to last. A file imports only
/// from its own layer or an earlier one: a cycle check alone would let a
/// rule import a call's arguments so long as nothing imported back. The
/// reference model (`local`, and `testkit`, its test half) sits between
/// the pure layers and the store: it reads rules and calls, and no layer
/// above it imports it.
const LIMITER_LAYERS: &[(&str, &[&str])] = &[
    (
        "rules and policy",
        &[
            "rule",
            "decision",
            "learn",
            "policy",
            "overrides",
            "pauses",
            "waits",
        ],
    ),
    (
        "call arguments and replies",
        &["keys", "script", "reply", "shape", "parts"],
    ),
    ("the reference model", &["local", "testkit"]),
    ("the store", &["store", "redis"]),
    (
        "the Limiter facade",
        &[
            "core", "jobs", "coalesce", "shadow", "inspect", "restore", "refresh",
        ],
    ),
];

/// Each of `graph`'s edges that goes up a layer, as `from → to (layer →
/// layer)`; a module no layer names is an error of its own, so that a new
/// file is placed.
fn layer_breaks(graph: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|(_, ms)| ms.contains(&m));
    let mut breaks = Vec::new();
    for (from, tos) in graph {
        let Some(lf) = layer_of(from) else {
            breaks.push(format!("{from}: in no layer (place it in LIMITER_LAYERS)"));
            continue;
        };
        for to in tos {
            match layer_of(to) {
                Some(lt) if lt > lf => breaks.push(format!(
                    "{from} → {to} ({} → {})",
                    layers[lf].0, layers[lt].0
                )),
                Some(_) => {}
                None => breaks.push(format!("{to}: in no layer (place it in LIMITER_LAYERS)")),
            }
        }
    }
    breaks
}

#[test]
fn the_limiters_files_import_only_from_their_own_layer_or_an_earlier_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graphs = inner_graphs(&src);
    let limiter = graphs.get("limiter").expect("a graph of limiter/'s files");
    assert!(
        limiter.get("core").is_some_and(|to| to.contains("store")),
        "the walk did not see the facade import the store:\n{}",
        picture(limiter)
    );
    let breaks = layer_breaks(limiter, LIMITER_LAYERS);
    assert!(
        breaks.is_empty(),
        "imports against the limiter's layers:\n{}",
        breaks.join("\n")
    );
    // The check has teeth: a rule that reads a call's arguments breaks it.
    let mut planted = limiter.clone();
    planted
        .entry("rule".to_owned())
        .or_default()
        .insert("script".to_owned());
    assert_eq!(
        layer_breaks(&planted, LIMITER_LAYERS),
        ["rule → script (rules and policy → call arguments and replies)"]
    );
}
