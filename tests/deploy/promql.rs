//! Metric and label names in PromQL, held against what a worker exports.
//! A fast pre-check: the queries are then evaluated by a real Prometheus
//! scraping a running worker (`tests/deploy/prometheus.rs`), which is what
//! says they are valid PromQL and return series.
//!
//! Not a PromQL parser: a tokenizer that knows enough to tell a metric name
//! from a function, a keyword, a label, a duration or a string, which is
//! all the dashboard and the scaler queries need checking for.

use std::collections::{BTreeMap, BTreeSet};

/// `name{label op "value", ...}` as written in a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: String,
    pub matchers: Vec<(String, String, String)>,
}

/// What one query names: metric selectors, and the labels of its `by`,
/// `without`, `on`, `ignoring`, `group_left` and `group_right` clauses.
#[derive(Debug, Default)]
pub struct Refs {
    pub selectors: Vec<Selector>,
    pub grouping: Vec<String>,
}

const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];
/// Aggregation operators: `sum by (x) (...)` puts a clause between the
/// operator and its parenthesis.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The names a query refers to. `Err` for text that does not tokenize
/// (an unclosed string, brace or bracket).
pub fn refs(expr: &str) -> Result<Refs, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Refs::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i)?;
        } else if c == '[' {
            i = find(&chars, i, ']')? + 1;
        } else if c == '{' {
            // A bare selector with no name (`{__name__=~"..."}`): its
            // matchers name no metric to check.
            i = find(&chars, i, '}')? + 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':' | '$'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let next = chars.get(j).copied();
            if GROUPING.contains(&word.as_str()) {
                if next == Some('(') {
                    let end = find(&chars, j, ')')?;
                    let list: String = chars[j + 1..end].iter().collect();
                    out.grouping.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(str::to_owned),
                    );
                    i = end + 1;
                }
            } else if word.starts_with('$')
                || KEYWORDS.contains(&word.as_str())
                || AGGREGATIONS.contains(&word.as_str())
                || next == Some('(')
            {
                // A Grafana variable, a keyword, or a function or
                // aggregation applied to what follows.
            } else {
                let mut matchers = Vec::new();
                if next == Some('{') {
                    let end = find(&chars, j, '}')?;
                    let body: String = chars[j + 1..end].iter().collect();
                    matchers =
                        parse_matchers(&body).map_err(|e| format!("{word}{{{body}}}: {e}"))?;
                    i = end + 1;
                }
                out.selectors.push(Selector {
                    name: word,
                    matchers,
                });
            }
        } else {
            i += 1;
        }
    }
    Ok(out)
}

fn skip_string(chars: &[char], start: usize) -> Result<usize, String> {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == quote {
            return Ok(i + 1);
        }
        i += 1;
    }
    Err(format!("unclosed string from column {start}"))
}

/// The closing `close` of the bracket at `open`, skipping strings.
fn find(chars: &[char], open: usize, close: char) -> Result<usize, String> {
    let mut i = open + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i)?,
            c if c == close => return Ok(i),
            _ => i += 1,
        }
    }
    Err(format!("unclosed '{}' from column {open}", chars[open]))
}

fn parse_matchers(body: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    loop {
        while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i >= chars.len() {
            return Ok(out);
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let label: String = chars[start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let op_start = i;
        while i < chars.len() && matches!(chars[i], '=' | '!' | '~') {
            i += 1;
        }
        let op: String = chars[op_start..i].iter().collect();
        if label.is_empty() || !["=", "!=", "=~", "!~"].contains(&op.as_str()) {
            return Err(format!("cannot read a matcher at column {start}"));
        }
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if !matches!(chars.get(i), Some('"' | '\'' | '`')) {
            return Err(format!("{label}{op}: the value is not a string"));
        }
        let end = skip_string(&chars, i)?;
        let value: String = chars[i + 1..end - 1].iter().collect();
        out.push((label, op, value));
        i = end;
    }
}

/// What a `/metrics` exposition shows, merged over several scrapes.
#[derive(Debug, Default, Clone)]
pub struct Exposition {
    /// `# TYPE name kind` lines: name → kind.
    pub types: BTreeMap<String, String>,
    /// Sample name → label name → the values seen.
    pub samples: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exposition {
    /// Adds one scrape (OpenMetrics or Prometheus text).
    pub fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut w = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (w.next(), w.next()) {
                    self.types.insert(name.to_owned(), kind.to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let series = match line.find('}') {
                Some(end) => &line[..=end],
                None => line.split_whitespace().next().unwrap_or(""),
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let entry = self.samples.entry(name.to_owned()).or_default();
            if let Ok(ms) = parse_matchers(labels) {
                for (k, _, v) in ms {
                    entry.entry(k).or_default().insert(v);
                }
            }
        }
    }

    /// Whether `name` is a sample name the worker exports: seen in a
    /// scrape, or implied by a `# TYPE` line (a counter `x` is sampled as
    /// `x_total`, a histogram as `x_bucket`, `x_sum`, `x_count`), which
    /// covers a labelled family no event of the run touched.
    pub fn exports(&self, name: &str) -> bool {
        if self.samples.contains_key(name) {
            return true;
        }
        self.types.iter().any(|(family, kind)| match kind.as_str() {
            "counter" => name == format!("{family}_total"),
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name == format!("{family}{s}")),
            _ => name == family,
        })
    }
}

/// Labels Prometheus adds to every scraped series (target labels), which
/// the exposition cannot show.
pub const TARGET_LABELS: &[&str] = &["instance", "job", "namespace", "pod", "container"];

/// Series Prometheus records for every target itself (not in a scrape).
pub const PROMETHEUS_SERIES: &[&str] = &["up"];

/// Problems of one query against `expo`: metric names the worker does not
/// export, labels they do not carry, label values never seen.
pub fn check(what: &str, expr: &str, expo: &Exposition) -> Vec<String> {
    let refs = match refs(expr) {
        Ok(r) => r,
        Err(e) => return vec![format!("{what}: `{expr}`: {e}")],
    };
    let mut problems = Vec::new();
    if refs.selectors.is_empty() {
        problems.push(format!("{what}: `{expr}` names no metric"));
    }
    for sel in &refs.selectors {
        if PROMETHEUS_SERIES.contains(&sel.name.as_str()) {
            continue;
        }
        if !expo.exports(&sel.name) {
            problems.push(format!(
                "{what}: `{expr}`: the worker exports no metric {}",
                sel.name
            ));
            continue;
        }
        for (label, op, value) in &sel.matchers {
            if TARGET_LABELS.contains(&label.as_str()) {
                continue;
            }
            match expo.samples.get(&sel.name) {
                None => problems.push(format!(
                    "{what}: `{expr}`: {}{{{label}...}} cannot be checked: the run exported no sample of {}",
                    sel.name, sel.name
                )),
                Some(labels) => match labels.get(label) {
                    None => problems.push(format!(
                        "{what}: `{expr}`: {} has no label {label} (it has {:?})",
                        sel.name,
                        labels.keys().collect::<Vec<_>>()
                    )),
                    Some(values) if (op == "=" || op == "!=") && !values.contains(value) => {
                        problems.push(format!(
                            "{what}: `{expr}`: {}{{{label}{op}\"{value}\"}}: the worker never exported {label}=\"{value}\" (seen: {values:?})",
                            sel.name
                        ))
                    }
                    Some(_) => {}
                },
            }
        }
    }
    for label in &refs.grouping {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        let carried = refs.selectors.iter().any(|s| {
            expo.samples
                .get(&s.name)
                .is_some_and(|l| l.contains_key(label))
        });
        if !carried {
            problems.push(format!(
                "{what}: `{expr}`: no metric of the query carries the label {label} it groups by"
            ));
        }
    }
    problems
}
