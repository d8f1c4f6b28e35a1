//! Temporary per-seller overrides ("seller X gets 500/min until 18:00
//! UTC"), set from the CLI and kept in Redis so every replica sees them:
//! one hash under the key prefix, a field per seller holding the rule and
//! its expiry. Each replica reads the hash every second; an override past
//! its expiry is ignored at once and removed by the next CLI write. This
//! module is the format, its validation and a worker's refresh
//! ([`super::Limiter::refresh_overrides`]); the CLI's writes are in
//! [`super::redis`].

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::policy::RuleSet;
use super::rule::{Algorithm, Rule};

/// How often a worker reads the overrides.
pub const REFRESH: Duration = Duration::from_secs(1);

/// One seller's override as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub algorithm: String,
    pub limit: u64,
    pub period_ms: u64,
    #[serde(default)]
    pub burst: Option<u64>,
    /// Unix ms after which it no longer applies.
    pub until_ms: u64,
}

impl Override {
    /// The rule it stands for, or why it is not one.
    pub fn rule(&self) -> Result<Rule, String> {
        let algorithm: Algorithm = self.algorithm.parse().map_err(|e| format!("{e}"))?;
        Rule::new(
            algorithm,
            self.limit,
            Duration::from_millis(self.period_ms),
            self.burst,
        )
        .map_err(|e| e.to_string())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain fields serialize")
    }
}

/// Reads a rule written as `ALGORITHM:LIMIT/PERIOD[:BURST]`, e.g.
/// `gcra:500/1m` or `token_bucket:600/1m:50`, as an override until `until_ms`.
pub fn parse_rule(spec: &str, until_ms: u64) -> Result<Override, String> {
    let shape = || {
        format!("{spec:?}: write ALGORITHM:LIMIT/PERIOD[:BURST], e.g. gcra:500/1m or token_bucket:600/1m:50")
    };
    let mut parts = spec.trim().split(':');
    let (Some(algorithm), Some(rate)) = (parts.next(), parts.next()) else {
        return Err(shape());
    };
    let burst = match parts.next() {
        Some(b) => Some(
            b.parse::<u64>()
                .map_err(|e| format!("{}: burst {b:?}: {e}", shape()))?,
        ),
        None => None,
    };
    if parts.next().is_some() {
        return Err(shape());
    }
    let (limit, period) = rate.split_once('/').ok_or_else(shape)?;
    let limit = limit
        .parse::<u64>()
        .map_err(|e| format!("{}: limit {limit:?}: {e}", shape()))?;
    let period = humantime::parse_duration(period)
        .map_err(|e| format!("{}: period {period:?}: {e}", shape()))?;
    let o = Override {
        algorithm: algorithm.to_owned(),
        limit,
        period_ms: period.as_millis() as u64,
        burst,
        until_ms,
    };
    o.rule()?;
    Ok(o)
}

/// The overrides in force at `now_ms` from the hash's fields: expired ones
/// and fields that do not parse (written by something else) are skipped.
pub fn in_force(fields: &HashMap<String, String>, now_ms: u64) -> HashMap<String, RuleSet> {
    fields
        .iter()
        .filter_map(|(seller, json)| {
            let o: Override = serde_json::from_str(json).ok()?;
            if o.until_ms <= now_ms {
                return None;
            }
            let rule = o.rule().ok()?;
            Some((seller.clone(), RuleSet::from(vec![rule])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(limit: u64, until_ms: u64) -> Override {
        Override {
            algorithm: "gcra".into(),
            limit,
            period_ms: 60_000,
            burst: None,
            until_ms,
        }
    }

    #[test]
    fn rules_parse_from_their_short_form() {
        let o = parse_rule("token_bucket:600/1m:50", 9).unwrap();
        assert_eq!(
            (o.limit, o.period_ms, o.burst, o.until_ms),
            (600, 60_000, Some(50), 9)
        );
        assert_eq!(parse_rule("gcra:5/1s", 9).unwrap().burst, None);
        for bad in [
            "gcra",
            "gcra:5",
            "gcra:x/1s",
            "gcra:5/soon",
            "nope:5/1s",
            "gcra:0/1s",
            "gcra:5/1s:2:3",
        ] {
            assert!(parse_rule(bad, 9).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn expired_and_unreadable_overrides_are_not_in_force() {
        let fields: HashMap<String, String> = [
            ("live".to_owned(), o(500, 2_000).to_json()),
            ("expired".to_owned(), o(500, 1_000).to_json()),
            ("garbage".to_owned(), "{".to_owned()),
            ("zero".to_owned(), o(0, 2_000).to_json()),
        ]
        .into_iter()
        .collect();
        let live = in_force(&fields, 1_000);
        assert_eq!(live.keys().collect::<Vec<_>>(), vec!["live"]);
        assert_eq!(live["live"][0].limit().get(), 500);
        assert!(in_force(&fields, 2_000).is_empty(), "gone at its expiry");
    }
}
