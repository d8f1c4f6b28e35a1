//! Checkers for the deployment files, and their tests (`files`).
//! There is no Docker engine or Kubernetes cluster in CI, so each file is
//! parsed and held against what the binary really accepts: its config
//! structs, its command line, its metrics.
//!
//! Every checker returns the problems it finds as sentences naming the file
//! and the key (empty: all good), so a test shows them all at once and the
//! mutation tests can assert that a broken copy is rejected for the right
//! reason.
//!
//! - [`dockerfile`]: a small Dockerfile reader (stages, ENV, COPY, ...)
//!   and the image checks.
//! - [`env`]: `THROTTLE__…` variables checked by loading them with the
//!   real config loader; container paths mapped to repository files.
//! - [`cli`]: a container's command line parsed with the binary's clap
//!   definitions.
//! - [`compose`]: `docker-compose.yml`, `deploy/prometheus`, `deploy/grafana`.
//! - [`kube`]: the manifests of `deploy/kubernetes/`.
//! - [`promql`]: metric and label names in PromQL, against a scrape (a
//!   fast pre-check).
//! - [`prometheus`]: a real Prometheus on loopback scraping running
//!   workers with the shipped config and rules; queries through its API.
#![allow(dead_code)]

pub mod cli;
pub mod compose;
pub mod dockerfile;
pub mod env;
mod files;
pub mod kube;
pub mod prometheus;
pub mod promql;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A repository file's text; panics naming the file if it cannot be read.
pub fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every document of a YAML text, as JSON values (aliases resolved).
pub fn yaml_docs(text: &str) -> Result<Vec<Value>, String> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).map_err(|e| e.to_string()))
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

/// The single YAML document of a repository file.
pub fn yaml_file(rel: &str) -> Value {
    let mut docs = yaml_docs(&read(rel)).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"));
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.remove(0)
}

/// A scalar as text: YAML writes `replicas: 3` and `KAFKA_NODE_ID: 1`
/// unquoted, and environment values are strings either way.
pub fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `a.b.c` in a JSON value (`Null` when absent).
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| match v {
        Value::Object(m) => m.get(k).unwrap_or(&Value::Null),
        Value::Array(a) => k
            .parse::<usize>()
            .ok()
            .and_then(|i| a.get(i))
            .unwrap_or(&Value::Null),
        _ => &Value::Null,
    })
}

/// The port of `host:port` (or of a URL's authority).
pub fn port_of(addr: &str) -> Option<u16> {
    let rest = addr.split("://").last()?;
    let authority = rest.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

/// The host of `host:port` (or of a URL's authority), credentials dropped.
pub fn host_of(addr: &str) -> Option<String> {
    let rest = addr.split("://").last()?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit('@').next()?;
    Some(
        authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .to_owned(),
    )
}

/// A path given relative to `base` (compose resolves `./x` against the
/// compose file's directory), normalised for display.
pub fn resolve(base: &Path, rel: &str) -> PathBuf {
    let p = Path::new(rel);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let mut out = base.to_path_buf();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}
