//! The book's reference pages that the code can write: the command line
//! (from clap's definitions), the configuration (from the config structs,
//! their doc comments, `config/default.toml` and the loader's own checks),
//! the metrics (from the registered metrics' help texts) and the
//! dead-letter kinds (from the list the code assigns them from). Each test
//! fails when its page differs from what the code generates today;
//! `THROTTLE_DOCS_BLESS=1 cargo test --test deploy docs::` rewrites them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::CommandFactory;
use throttle_worker::cli::Cli;
use throttle_worker::config::{load_from, DEFAULT_TOML};

use super::repo;

const BLESS: &str = "THROTTLE_DOCS_BLESS";
const REGENERATE: &str = "THROTTLE_DOCS_BLESS=1 cargo test --test deploy docs::";

/// Compares `page` (relative to `docs/src/reference`) with `generated`, or
/// writes it when blessing.
fn check_page(page: &str, generated: &str) {
    let path = repo().join("docs/src/reference").join(page);
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(&path, generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk == generated {
        return;
    }
    let first = on_disk
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
    panic!(
        "docs/src/reference/{page} is stale: line {} is\n  {:?}\nbut the code now gives\n  {:?}\nRun `{REGENERATE}` and commit the page.",
        first + 1,
        on_disk.lines().nth(first).unwrap_or("(end of file)"),
        generated.lines().nth(first).unwrap_or("(end of file)"),
    );
}

fn header(title: &str, from: &str) -> String {
    format!("# {title}\n\n<!-- generated from {from} by `{REGENERATE}`: do not edit -->\n\n")
}

/// A table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn parse(file: &str) -> syn::File {
    let path = repo().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The doc comment of an item or field, its lines joined; paragraphs kept
/// apart by a blank line.
fn doc_of(attrs: &[syn::Attribute]) -> String {
    let mut out = String::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let syn::Meta::NameValue(nv) = &attr.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                let line = s.value();
                let line = line.trim();
                if line.is_empty() {
                    out.push_str("\n\n");
                } else {
                    if !out.is_empty() && !out.ends_with('\n') {
                        out.push(' ');
                    }
                    out.push_str(line);
                }
            }
        }
    }
    out.trim().to_owned()
}

// ---------------------------------------------------------------------
// The command line.

/// The subcommands built only with the `dev-tools` feature: variants of
/// src/cli.rs's enums under `#[cfg(feature = "dev-tools")]`, kebab-cased.
fn dev_tools_commands() -> Vec<String> {
    let file = parse("src/cli.rs");
    let mut out = Vec::new();
    for item in &file.items {
        let syn::Item::Enum(e) = item else { continue };
        for v in &e.variants {
            let dev = v.attrs.iter().any(|a| {
                a.path().is_ident("cfg")
                    && a.meta
                        .require_list()
                        .is_ok_and(|l| l.tokens.to_string().contains("\"dev-tools\""))
            });
            if dev {
                out.push(kebab(&v.ident.to_string()));
            }
        }
    }
    out
}

fn kebab(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn cli_page() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let dev = dev_tools_commands();
    let mut out = header("Command line", "src/cli.rs");
    writeln!(
        out,
        "{}\n\nEvery command prints its own help with `--help`; `throttle-worker completions SHELL` writes shell completions and `throttle-worker man DIR` the man pages.\nCommands marked *dev tools* exist only in a build with the `dev-tools` feature, which `cargo build` turns on and the container image leaves out.\n",
        cmd.get_about().map(|a| a.to_string()).unwrap_or_default()
    )
    .unwrap();
    let mut sections = String::new();
    let mut index = String::new();
    walk_command(&cmd, &[], &dev, &mut index, &mut sections);
    out.push_str(&index);
    out.push('\n');
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        writeln!(out, "{}\n", after.to_string().trim()).unwrap();
    }
    out.push_str(&sections);
    out
}

fn walk_command(
    cmd: &clap::Command,
    path: &[String],
    dev: &[String],
    index: &mut String,
    out: &mut String,
) {
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        if name == "help" || sub.is_hide_set() {
            continue;
        }
        let mut full = path.to_vec();
        full.push(name.to_owned());
        let title = format!("throttle-worker {}", full.join(" "));
        let is_dev = dev.iter().any(|d| d == name);
        let depth = full.len();
        let marker = if is_dev { " (dev tools)" } else { "" };
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        writeln!(
            index,
            "{}- [`{title}`](#{}){marker}: {}",
            "  ".repeat(depth - 1),
            title.replace(' ', "-"),
            cell(&about)
        )
        .unwrap();
        writeln!(out, "## `{title}`\n").unwrap();
        if is_dev {
            writeln!(out, "*Dev tools build only.*\n").unwrap();
        }
        let long = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        if !long.is_empty() {
            writeln!(out, "{}\n", long.trim()).unwrap();
        }
        let aliases: Vec<&str> = sub.get_visible_aliases().collect();
        if !aliases.is_empty() {
            writeln!(out, "Alias: `{}`.\n", aliases.join("`, `")).unwrap();
        }
        let mut usage_cmd = sub.clone().bin_name(&title);
        let usage = usage_cmd.render_usage().to_string();
        writeln!(out, "```text\n{}\n```\n", usage.trim()).unwrap();
        let args: Vec<&clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
            .collect();
        if !args.is_empty() {
            writeln!(out, "| argument | default | description |\n|---|---|---|").unwrap();
            for arg in args {
                writeln!(out, "{}", arg_row(arg)).unwrap();
            }
            out.push('\n');
        }
        walk_command(sub, &full, dev, index, out);
    }
}

fn arg_row(arg: &clap::Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    let takes = arg.get_action().takes_values();
    let mut name = match arg.get_long() {
        Some(long) if takes => format!("`--{long} <{value}>`"),
        Some(long) => format!("`--{long}`"),
        None => format!("`<{value}>`"),
    };
    if let Some(short) = arg.get_short() {
        name = format!("`-{short}`, {name}");
    }
    if let Some(aliases) = arg.get_visible_aliases() {
        for a in aliases {
            name.push_str(&format!(", `--{a}`"));
        }
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let default = if defaults.is_empty() {
        String::new()
    } else {
        format!("`{}`", defaults.join(","))
    };
    let mut help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() && arg.get_action().takes_values() {
        help.push_str(&format!(" One of {}.", values.join(", ")));
    }
    if arg.is_required_set() {
        help.push_str(" Required.");
    }
    if let Some(env) = arg.get_env() {
        help.push_str(&format!(" Environment: `{}`.", env.to_string_lossy()));
    }
    format!("| {name} | {default} | {} |", cell(&help))
}

#[test]
fn the_cli_reference_is_clap_s() {
    check_page("cli.md", &cli_page());
}

// ---------------------------------------------------------------------
// The configuration.

/// One key of the configuration as the reference shows it.
pub(crate) struct ConfigRow {
    pub key: String,
    pub kind: String,
    pub default: Option<String>,
    /// `THROTTLE__SECTION__KEY`, or `None` for lists and tables (a file
    /// only).
    pub env: Option<String>,
    pub live: bool,
    /// What the loader refuses, probed: "value: problem".
    pub refused: Vec<String>,
    pub doc: String,
}

/// The structs and enums of src/config/, by name.
struct ConfigTypes {
    structs: BTreeMap<String, syn::ItemStruct>,
    enums: BTreeMap<String, syn::ItemEnum>,
}

fn config_types() -> ConfigTypes {
    let mut structs = BTreeMap::new();
    let mut enums = BTreeMap::new();
    let dir = repo().join("src/config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for path in files {
        let rel = path.strip_prefix(repo()).unwrap().display().to_string();
        for item in parse(&rel).items {
            match item {
                syn::Item::Struct(s) => {
                    structs.insert(s.ident.to_string(), s);
                }
                syn::Item::Enum(e) => {
                    enums.insert(e.ident.to_string(), e);
                }
                _ => {}
            }
        }
    }
    ConfigTypes { structs, enums }
}

/// A type's last path segment and its generic arguments.
fn segments(ty: &syn::Type) -> Option<(String, Vec<&syn::Type>)> {
    let syn::Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    let args = match &last.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some((last.ident.to_string(), args))
}

/// The `serde(...)` attribute values of a field: `rename`, `deserialize_with`, ...
fn serde_attr(attrs: &[syn::Attribute], name: &str) -> Option<String> {
    let mut found = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident(name) {
                if let Ok(v) = meta.value() {
                    let s: syn::LitStr = v.parse()?;
                    found = Some(s.value());
                }
            } else if meta.input.peek(syn::Token![=]) {
                let _: syn::Expr = meta.value()?.parse()?;
            }
            Ok(())
        });
    }
    found
}

/// What a value of `ty` is, in the operator's words, and whether the
/// environment can set it.
fn kind_of(ty: &syn::Type, with: Option<&str>, types: &ConfigTypes) -> (String, bool) {
    let Some((name, args)) = segments(ty) else {
        return ("value".into(), false);
    };
    if let Some(with) = with {
        if with.contains("durations") {
            return ("list of durations".into(), false);
        }
        if with.contains("duration") {
            return ("duration".into(), true);
        }
        if with.contains("size") || with.contains("bytes") {
            return ("size".into(), true);
        }
    }
    match name.as_str() {
        "Option" => kind_of(args[0], with, types),
        "String" => ("string".into(), true),
        "PathBuf" => ("path".into(), true),
        "SocketAddr" => ("address".into(), true),
        "bool" => ("boolean".into(), true),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => ("integer".into(), true),
        "f32" | "f64" => ("number".into(), true),
        "Duration" => ("duration".into(), true),
        "Vec" => {
            let (inner, _) = kind_of(args[0], None, types);
            (format!("list of {}", plural(&inner)), false)
        }
        "BTreeMap" | "HashMap" => {
            let (inner, _) = kind_of(args[1], None, types);
            (format!("table of {}", plural(&inner)), false)
        }
        other => {
            if let Some(e) = types.enums.get(other) {
                let values = enum_values(e);
                if values.is_empty() {
                    ("string".into(), true)
                } else {
                    (format!("one of {}", values.join(", ")), true)
                }
            } else if types.structs.get(other).is_some_and(|s| {
                s.attrs.iter().any(|a| {
                    a.path().is_ident("serde")
                        && a.meta
                            .require_list()
                            .is_ok_and(|l| l.tokens.to_string().contains("try_from"))
                })
            }) {
                // Parsed from a list of strings (`serde(try_from)`).
                ("list of strings".into(), false)
            } else if other.ends_with("Config") && other != "LimitsConfig" {
                (other_name(other), false)
            } else {
                (other.to_owned(), false)
            }
        }
    }
}

/// "rule" → "rules", "list of rules" → "rule lists".
fn plural(kind: &str) -> String {
    match kind.strip_prefix("list of ") {
        Some(items) => format!("{} lists", items.trim_end_matches('s')),
        None => format!("{kind}s"),
    }
}

fn other_name(ty: &str) -> String {
    match ty {
        "RuleConfig" => "rule".into(),
        "SellerConfig" => "seller".into(),
        other => other.trim_end_matches("Config").to_lowercase(),
    }
}

/// An enum's values as serde reads them (`rename_all = "snake_case"` or a
/// variant's `rename`); none when it parses itself.
fn enum_values(e: &syn::ItemEnum) -> Vec<String> {
    let derives_deserialize = e.attrs.iter().any(|a| {
        a.path().is_ident("derive")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().contains("Deserialize"))
    });
    let snake = serde_attr(&e.attrs, "rename_all").is_some_and(|r| r == "snake_case");
    if !derives_deserialize || serde_attr(&e.attrs, "try_from").is_some() {
        return Vec::new();
    }
    e.variants
        .iter()
        .map(|v| {
            let name = serde_attr(&v.attrs, "rename").unwrap_or_else(|| {
                if snake {
                    kebab(&v.ident.to_string()).replace('-', "_")
                } else {
                    v.ident.to_string()
                }
            });
            format!("`{name}`")
        })
        .collect()
}

/// `config/default.toml`'s value of a dotted key, as TOML.
fn default_of(defaults: &toml::Table, key: &str) -> Option<String> {
    let mut at = defaults;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let v = at.get(*part)?;
        if i + 1 == parts.len() {
            return Some(match v {
                toml::Value::String(s) => format!("\"{s}\""),
                other => other.to_string(),
            });
        }
        at = v.as_table()?;
    }
    None
}

/// The values the loader refuses for a key, tried one by one from the
/// environment: the range it checks, in its own words.
fn refused(key: &str, kind: &str, env: &str) -> Vec<String> {
    let probes: &[&str] = match kind {
        "integer" => &["0", "4294967295"],
        "number" => &["-0.5", "1.5"],
        "duration" => &["0s", "1000d"],
        "size" => &["0", "1000TiB"],
        _ => &[],
    };
    let mut out = Vec::new();
    for probe in probes {
        // A companion some keys need to be checked at all.
        let mut vars = vec![(env.to_owned(), (*probe).to_owned())];
        if key == "tracing.sample_ratio" {
            vars.push((
                "THROTTLE__TRACING__OTLP_ENDPOINT".into(),
                "http://127.0.0.1:4318".into(),
            ));
        }
        if let Err(e) = load_from(None, vars) {
            if e.key == key {
                out.push(format!("`{probe}`: {}", e.problem));
            }
        }
    }
    out
}

pub(crate) fn config_rows() -> Vec<ConfigRow> {
    let types = config_types();
    let defaults: toml::Table = toml::from_str(DEFAULT_TOML).expect("default.toml parses");
    let mut rows = Vec::new();
    let settings = &types.structs["Settings"];
    for field in &settings.fields {
        let section = field.ident.as_ref().unwrap().to_string();
        let (ty, _) = segments(&field.ty).unwrap();
        walk_struct(&types, &types.structs[&ty], &section, &defaults, &mut rows);
    }
    rows
}

fn walk_struct(
    types: &ConfigTypes,
    s: &syn::ItemStruct,
    prefix: &str,
    defaults: &toml::Table,
    rows: &mut Vec<ConfigRow>,
) {
    for field in &s.fields {
        let Some(ident) = &field.ident else { continue };
        if serde_attr(&field.attrs, "skip").is_some()
            || field.attrs.iter().any(|a| {
                a.path().is_ident("serde")
                    && a.meta
                        .require_list()
                        .is_ok_and(|l| l.tokens.to_string().trim() == "skip")
            })
        {
            continue;
        }
        let name = serde_attr(&field.attrs, "rename").unwrap_or_else(|| ident.to_string());
        let key = format!("{prefix}.{name}");
        let (ty_name, _) = segments(&field.ty).unwrap_or_default();
        if let Some(inner) = types.structs.get(&ty_name) {
            if serde_attr(&inner.attrs, "try_from").is_none() {
                walk_struct(types, inner, &key, defaults, rows);
                continue;
            }
        }
        let with = serde_attr(&field.attrs, "deserialize_with");
        let (kind, env_ok) = kind_of(&field.ty, with.as_deref(), types);
        let env_name = format!("THROTTLE__{}", key.replace('.', "__").to_uppercase());
        let refused = if env_ok {
            refused(&key, &kind, &env_name)
        } else {
            Vec::new()
        };
        rows.push(ConfigRow {
            default: default_of(defaults, &key),
            env: env_ok.then_some(env_name),
            live: key.starts_with("limits.") && key != "limits.file",
            refused,
            doc: doc_of(&field.attrs),
            kind,
            key,
        });
    }
}

fn config_page(rows: &[ConfigRow]) -> String {
    let mut out = header(
        "Configuration",
        "the config structs of src/config/, their doc comments, config/default.toml and the loader's checks",
    );
    out.push_str(
        "Settings merge in this order, each over the one before: the defaults compiled in \
(`config/default.toml`), the file given with `--config`, then environment variables \
`THROTTLE__SECTION__KEY` (a double underscore between the parts). `[limits]` may also come \
from the file that `limits.file` names. A key or section the worker does not know stops \
startup, naming the file and the key.\n\n\
- **type**: a *duration* is written like `250ms`, `30s`, `5m`, `2h`; a *size* in bytes, as \
an integer or with a unit (`256MiB`, `64KiB`, `1GB`).\n\
- **environment**: the variable that sets the key; *file only* for lists and tables (but see \
[Environment](environment.md) for librdkafka properties and `_FILE` secrets).\n\
- **reload**: *live* keys take effect on an edit of the file or a SIGHUP, on every replica, \
without a restart; the others are read at startup.\n\
- **refused**: values the loader turns down, as it was asked while this page was generated, \
and why.\n\n",
    );
    let mut section = "";
    for row in rows {
        let s = row.key.split('.').next().unwrap();
        if s != section {
            section = s;
            writeln!(out, "## `[{s}]`\n").unwrap();
        }
        writeln!(out, "### `{}`\n", row.key).unwrap();
        if !row.doc.is_empty() {
            writeln!(out, "{}\n", row.doc).unwrap();
        }
        let default = match &row.default {
            Some(d) => format!("`{d}`"),
            None => "unset".into(),
        };
        let env = match &row.env {
            Some(e) => format!("`{e}`"),
            None => "file only".into(),
        };
        writeln!(
            out,
            "| type | default | environment | reload |\n|---|---|---|---|\n| {} | {default} | {env} | {} |\n",
            cell(&row.kind),
            if row.live { "live" } else { "restart" }
        )
        .unwrap();
        if !row.refused.is_empty() {
            writeln!(out, "Refused: {}.\n", row.refused.join("; ")).unwrap();
        }
    }
    out
}

#[test]
fn the_configuration_reference_is_the_structs() {
    let rows = config_rows();
    assert!(rows.len() >= 50, "{} keys", rows.len());
    for row in &rows {
        assert!(
            !row.doc.is_empty(),
            "{}: no doc comment on its field in src/config/: the reference has nothing to say",
            row.key
        );
    }
    check_page("configuration.md", &config_page(&rows));
}

// ---------------------------------------------------------------------
// The metrics.

/// One metric as src/telemetry/metrics.rs registers it.
#[derive(Default)]
struct MetricSource {
    /// The help text it is registered with (what `# HELP` says).
    help: String,
    /// `counter`, `gauge` or `histogram`, from the field's type.
    kind: String,
    /// The label struct's fields.
    labels: Vec<String>,
    /// The doc comment of the field it is registered into.
    doc: String,
}

/// Every metric src/telemetry/metrics.rs registers, by name: each
/// `field: reg!("name", "help", ...)`, the field's doc comment and type
/// (`Family<Labels, Metric>`, a metric, or an alias of either), and the
/// label struct's fields. Read from the source because the registry does
/// not encode a family that has no series yet.
fn metric_sources() -> BTreeMap<String, MetricSource> {
    let file = parse("src/telemetry/metrics.rs");
    let mut label_structs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut aliases: BTreeMap<String, syn::Type> = BTreeMap::new();
    let mut fields: BTreeMap<String, (syn::Type, String)> = BTreeMap::new();
    for item in &file.items {
        match item {
            syn::Item::Struct(s) if s.ident == "Metrics" => {
                for f in &s.fields {
                    let name = f.ident.as_ref().unwrap().to_string();
                    fields.insert(name, (f.ty.clone(), doc_of(&f.attrs)));
                }
            }
            syn::Item::Struct(s) => {
                label_structs.insert(
                    s.ident.to_string(),
                    s.fields
                        .iter()
                        .filter_map(|f| f.ident.as_ref().map(|i| i.to_string()))
                        .collect(),
                );
            }
            syn::Item::Type(t) => {
                aliases.insert(t.ident.to_string(), (*t.ty).clone());
            }
            _ => {}
        }
    }
    // `field: reg!("name", "help", ...)` anywhere in the file: field, name, help.
    struct Visit(Vec<(String, String, String)>);
    impl<'ast> syn::visit::Visit<'ast> for Visit {
        fn visit_field_value(&mut self, fv: &'ast syn::FieldValue) {
            if let (syn::Member::Named(field), syn::Expr::Macro(m)) = (&fv.member, &fv.expr) {
                if m.mac.path.is_ident("reg") {
                    let args = m
                        .mac
                        .parse_body_with(
                            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
                        )
                        .expect("reg!(name, help, metric)");
                    let text = |i: usize| match args.iter().nth(i) {
                        Some(syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(s),
                            ..
                        })) => s.value(),
                        _ => panic!("reg! into {field}: argument {i} is not a string literal"),
                    };
                    self.0.push((field.to_string(), text(0), text(1)));
                }
            }
            syn::visit::visit_field_value(self, fv);
        }
    }
    let mut registered = Visit(Vec::new());
    syn::visit::Visit::visit_file(&mut registered, &file);
    let mut out = BTreeMap::new();
    for (field, metric, help) in registered.0 {
        let (ty, doc) = fields
            .get(&field)
            .cloned()
            .unwrap_or_else(|| panic!("reg! into {field}, which Metrics does not have"));
        let mut source = MetricSource {
            help,
            doc,
            ..MetricSource::default()
        };
        let mut ty = Some(ty);
        while let Some((name, args)) = ty.as_ref().and_then(segments) {
            match name.as_str() {
                "Family" => {
                    let (labels, _) = segments(args[0]).unwrap();
                    source.labels = label_structs.get(&labels).cloned().unwrap_or_default();
                    ty = Some(args[1].clone());
                }
                "Counter" | "Gauge" | "Histogram" => {
                    source.kind = name.to_lowercase();
                    break;
                }
                other => ty = aliases.get(other).cloned(),
            }
        }
        out.insert(format!("throttle_{metric}"), source);
    }
    out
}

fn metrics_page(sources: &BTreeMap<String, MetricSource>) -> String {
    let mut out = header(
        "Metrics",
        "the metrics src/telemetry/metrics.rs registers, their help texts, label sets and doc comments",
    );
    out.push_str(
        "Every replica serves these at `GET /metrics` (OpenMetrics text). A counter's series \
carries `_total` after its name; a histogram's `_bucket`, `_sum` and `_count`. A seller \
gets its own `seller` label only when the config names it (`[limits.sellers]`); every \
other seller is counted as `seller=\"other\"`, so cardinality stays bounded. A series \
with labels appears once something has been counted under them.\n\n\
| metric | type | labels | meaning |\n|---|---|---|---|\n",
    );
    for (name, source) in sources {
        let series = match source.kind.as_str() {
            "counter" => format!("{name}_total"),
            _ => name.clone(),
        };
        let labels = source
            .labels
            .iter()
            .map(|x| format!("`{x}`"))
            .collect::<Vec<_>>()
            .join(", ");
        // The field's doc comment says more than the one-line help text
        // Prometheus shows; the help text stands in where there is none.
        let meaning = if source.doc.is_empty() {
            format!("{}.", source.help.trim_end_matches('.'))
        } else {
            source.doc.clone()
        };
        writeln!(
            out,
            "| `{series}` | {} | {labels} | {} |",
            source.kind,
            cell(&meaning)
        )
        .unwrap();
    }
    out
}

#[test]
fn the_metrics_reference_is_the_registry() {
    let sources = metric_sources();
    // What the source says is what the registry serves: every metric the
    // process encodes is read from the source, with the same help and type.
    let text = throttle_worker::telemetry::metrics::metrics().render();
    let mut encoded = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let source = sources
                .get(name)
                .unwrap_or_else(|| panic!("{name} is registered, but not read from the source"));
            // The encoder ends every help text with a full stop.
            assert_eq!(
                source.help.trim_end_matches('.'),
                help.trim_end_matches('.'),
                "{name}: the help text"
            );
            encoded += 1;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            assert_eq!(sources[name].kind, kind, "{name}: the type");
        }
    }
    assert!(encoded >= 30, "only {encoded} metrics encoded");
    let undocumented: Vec<&String> = sources
        .iter()
        .filter(|(_, s)| s.doc.is_empty())
        .map(|(m, _)| m)
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics whose field in src/telemetry/metrics.rs has no doc comment: {undocumented:?}"
    );
    check_page("metrics.md", &metrics_page(&sources));
}

// ---------------------------------------------------------------------
// Dead-letter kinds and exit codes: the code's own lists.

fn dead_letter_kinds_page() -> String {
    use throttle_worker::dead_letter::DeadLetterKind;
    let mut out = header("Dead-letter kinds", "src/dead_letter.rs (`DeadLetterKind`)");
    out.push_str(
        "Every record on the dead-letter topic carries its kind in the `x-error-kind` header \
(the full reason, with the detail, in `x-error`), and every dead letter counts in \
`throttle_jobs_dead_lettered_total{reason=KIND}`. `throttle-worker dlq stats|show|replay \
--kind KIND` selects by it, and accepts only these. A kind that comes from the job itself \
fails the same way when replayed: fix the producer first.\n\n\
| kind | when, and what to do |\n|---|---|\n",
    );
    for kind in DeadLetterKind::ALL {
        writeln!(out, "| `{}` | {} |", kind.name(), cell(kind.description())).unwrap();
    }
    out
}

#[test]
fn the_dead_letter_kinds_are_the_code_s() {
    check_page("dead-letter-kinds.md", &dead_letter_kinds_page());
}

fn exit_codes_page() -> String {
    use throttle_worker::operator::ExitCode;
    let mut out = header("Exit codes", "src/operator/exit.rs (`ExitCode`)");
    out.push_str(
        "Every command of `throttle-worker` exits with one of these, so a script or a job \
runner can tell a refusal from a failure. The top-level `--help` ends with the same table.\n\n\
| code | meaning |\n|---|---|\n",
    );
    for code in ExitCode::ALL {
        writeln!(out, "| {} | {} |", code.code(), cell(code.description())).unwrap();
    }
    out
}

#[test]
fn the_exit_codes_are_the_code_s() {
    check_page("exit-codes.md", &exit_codes_page());
}
