//! How the commands write what they show: left-aligned tables for people,
//! and the times, durations and rules both forms share.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::limiter::Rule;

/// Unix ms as an RFC 3339 time, to the second.
pub(super) fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A rule as JSON: its parts and its text.
pub(super) fn rule_json(r: &Rule) -> Value {
    json!({
        "algorithm": r.algorithm().name(),
        "limit": r.limit().get(),
        "period": humantime::format_duration(r.period()).to_string(),
        "burst": r.burst(),
        "text": r.to_string(),
    })
}

/// Seconds, to the millisecond, for JSON.
pub(super) fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// A short duration for a table: `1.25s` under 10 s, else whole seconds.
pub(super) fn short(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    let ms = d.as_millis();
    if ms < 10_000 {
        format!("{:.2}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// Left-aligned columns, two spaces apart.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}
