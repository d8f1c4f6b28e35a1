//! The wait board: each replica's report of its sellers' waits (oldest
//! job, drain, what holds them), in one Redis hash, so that `limits show
//! SELLER` sees what every replica holds without reaching the replicas.
//! One field per replica (its worker id), a JSON [`Report`]; the hash
//! lives [`BOARD_LIFE`] after the last write, and a report older than
//! [`STALE`] (a replica gone) is ignored by readers and deleted by the
//! next writer.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a replica writes its report.
pub const EVERY: Duration = Duration::from_secs(5);
/// A report older than this is a replica gone.
pub const STALE: Duration = Duration::from_secs(30);
/// How long the hash lives after the last write.
pub const BOARD_LIFE: Duration = Duration::from_secs(300);

/// One seller's wait on one replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    pub seller: String,
    pub jobs: usize,
    pub units: u64,
    pub oldest_ms: u64,
    /// `None`: unlimited.
    pub drain_ms: Option<u64>,
    pub held_by: String,
}

/// A replica's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Unix ms on the replica's clock when it was taken.
    pub at_ms: u64,
    pub sellers: Vec<Wait>,
}

/// Whether the report written at `at_ms` also sweeps the stale ones: the
/// first of each [`STALE`] span, so a replica reads the whole board once
/// per span rather than at each write (every replica's read grows with the
/// fleet). Readers skip stale reports meanwhile; the hash expires whole
/// after [`BOARD_LIFE`] without writes.
pub fn sweeps(at_ms: u64) -> bool {
    at_ms % (STALE.as_millis() as u64) < EVERY.as_millis() as u64
}

/// The fresh reports of a board, by worker id, and the stale fields.
pub fn fresh(
    fields: &HashMap<String, String>,
    now_ms: u64,
) -> (Vec<(String, Report)>, Vec<String>) {
    let mut fresh = Vec::new();
    let mut stale = Vec::new();
    for (worker, json) in fields {
        match serde_json::from_str::<Report>(json) {
            Ok(r) if now_ms.saturating_sub(r.at_ms) <= STALE.as_millis() as u64 => {
                fresh.push((worker.clone(), r));
            }
            _ => stale.push(worker.clone()),
        }
    }
    fresh.sort_by(|a, b| a.0.cmp(&b.0));
    (fresh, stale)
}

/// One seller's wait across the fleet: each replica's that holds its jobs.
pub fn of_seller(reports: &[(String, Report)], seller: &str) -> Vec<(String, Wait)> {
    reports
        .iter()
        .filter_map(|(worker, r)| {
            r.sellers
                .iter()
                .find(|w| w.seller == seller)
                .map(|w| (worker.clone(), w.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(at_ms: u64, sellers: &[(&str, u64)]) -> String {
        serde_json::to_string(&Report {
            at_ms,
            sellers: sellers
                .iter()
                .map(|&(s, oldest_ms)| Wait {
                    seller: s.to_owned(),
                    jobs: 3,
                    units: 3,
                    oldest_ms,
                    drain_ms: Some(1000),
                    held_by: "rule 0".to_owned(),
                })
                .collect(),
        })
        .unwrap()
    }

    #[test]
    fn one_write_in_each_stale_span_sweeps() {
        let every = EVERY.as_millis() as u64;
        // A replica writing every 5 s from any phase sweeps once per 30 s.
        for phase in [0, 1_234, 4_999] {
            let sweeps = (0..60)
                .filter(|i| sweeps(1_700_000_000_000 + phase + i * every))
                .count();
            assert_eq!(sweeps, 10, "phase {phase}");
        }
    }

    #[test]
    fn reports_older_than_stale_or_unreadable_are_left_out() {
        let now = 1_000_000;
        let fields: HashMap<String, String> = [
            ("w1".to_owned(), report(now - 1_000, &[("a", 5_000)])),
            ("w2".to_owned(), report(now - 31_000, &[("a", 9_000)])),
            ("w3".to_owned(), "not json".to_owned()),
            (
                "w4".to_owned(),
                report(now - 29_000, &[("b", 1), ("a", 70)]),
            ),
        ]
        .into();
        let (fresh, mut stale) = fresh(&fields, now);
        stale.sort();
        assert_eq!(stale, ["w2", "w3"]);
        let a = of_seller(&fresh, "a");
        let seen: Vec<(&str, u64)> = a.iter().map(|(w, x)| (w.as_str(), x.oldest_ms)).collect();
        assert_eq!(seen, [("w1", 5_000), ("w4", 70)]);
        assert!(of_seller(&fresh, "c").is_empty());
    }
}
