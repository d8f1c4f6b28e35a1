//! Pauses: an operator stops the downstream calls of one seller, or of every
//! seller ("the downstream is in maintenance until 03:00"), without losing
//! or dead-lettering a job. Set from the CLI (`limits pause`, `limits
//! resume`) and kept in Redis so every replica sees them: one hash under the
//! key prefix, a field per paused seller (`s:<seller>`) and one for the
//! whole fleet (`all`), each holding who is paused, why and until when.
//! Each replica reads the hash every [`REFRESH`]; the engine holds a paused
//! seller's jobs (in memory, then in the retry tiers) and calls nothing of
//! it. This module is the format, what is in force and a worker's refresh
//! ([`super::Limiter::refresh_pauses`]); the CLI's writes are in
//! [`super::redis`], the engine's reading in `worker::sellers`.
//!
//! A pause's times are on Redis' clock: the CLI ends `--for D` at Redis'
//! `TIME` + D, and a replica keeps what is in force by Redis' clock, with
//! each end moved onto its own clock (it judges the end with that one, in
//! the engine). So a replica whose clock is off by a minute still ends the
//! pause with the others, not a minute early or late.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a worker reads the pauses: with the read's own time, a pause
/// stops every replica's calls within well under a second.
pub const REFRESH: Duration = Duration::from_millis(250);

/// The field of a pause of every seller.
pub const ALL: &str = "all";

/// The field of `seller`'s own pause (prefixed, so that no seller id can
/// be taken for [`ALL`]).
pub fn field(seller: &str) -> String {
    format!("s:{seller}")
}

/// One pause as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// Why, as the operator wrote it (shown by `limits show` and `list`).
    #[serde(default)]
    pub reason: String,
    /// Unix ms when it was set.
    pub since_ms: u64,
    /// Unix ms when it ends by itself; `None`: until `limits resume`.
    #[serde(default)]
    pub until_ms: Option<u64>,
}

impl Pause {
    /// Still in force at `now_ms`.
    pub fn in_force(&self, now_ms: u64) -> bool {
        self.until_ms.is_none_or(|u| u > now_ms)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain fields serialize")
    }

    /// The one of two pauses that holds longer (an open-ended one over any
    /// with an end).
    fn longer(self, other: Pause) -> Pause {
        match (self.until_ms, other.until_ms) {
            (None, _) => self,
            (_, None) => other,
            (Some(a), Some(b)) if a >= b => self,
            _ => other,
        }
    }
}

/// The pauses a replica holds between two reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pauses {
    /// Every seller paused.
    pub all: Option<Pause>,
    /// Sellers paused one by one.
    pub sellers: HashMap<String, Pause>,
}

impl Pauses {
    /// The pauses in force at `now_ms` among the hash's fields: ended ones
    /// and fields that do not parse (written by something else) are
    /// skipped.
    pub fn in_force(fields: &HashMap<String, String>, now_ms: u64) -> Pauses {
        Pauses::in_force_at(fields, now_ms, now_ms)
    }

    /// The pauses in force at `redis_ms` (Redis' clock, which the pauses'
    /// ends are on), each end moved onto a clock that reads `local_ms` at
    /// the same instant: the replica's, which the engine judges them by.
    pub fn in_force_at(fields: &HashMap<String, String>, redis_ms: u64, local_ms: u64) -> Pauses {
        let mut out = Pauses::default();
        for (name, json) in fields {
            let Ok(mut p) = serde_json::from_str::<Pause>(json) else {
                continue;
            };
            if !p.in_force(redis_ms) {
                continue;
            }
            p.until_ms = p.until_ms.map(|u| (u + local_ms).saturating_sub(redis_ms));
            if name == ALL {
                out.all = Some(p);
            } else if let Some(seller) = name.strip_prefix("s:") {
                out.sellers.insert(seller.to_owned(), p);
            }
        }
        out
    }

    /// What holds `seller` at `now_ms`: its own pause or the fleet's,
    /// whichever lasts longer.
    pub fn of(&self, seller: &str, now_ms: u64) -> Option<Pause> {
        let own = self.sellers.get(seller).filter(|p| p.in_force(now_ms));
        let all = self.all.as_ref().filter(|p| p.in_force(now_ms));
        match (own, all) {
            (Some(a), Some(b)) => Some(a.clone().longer(b.clone())),
            (a, b) => a.or(b).cloned(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_none() && self.sellers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33 (item 6): a replica whose clock is a minute behind Redis'
    /// held a pause a minute past its end, and one ahead ended it a minute
    /// early. The end is judged on Redis' clock, then moved onto the
    /// replica's.
    #[test]
    fn a_pause_ends_on_redis_clock_whatever_the_replica_s_clock() {
        let redis_end = 1_000_000;
        let fields = HashMap::from([(
            field("a"),
            Pause {
                reason: String::new(),
                since_ms: 900_000,
                until_ms: Some(redis_end),
            }
            .to_json(),
        )]);
        for skew in [-60_000i64, 0, 60_000] {
            // Redis says 1 s before the end; the replica's clock is `skew` off.
            let redis_now = redis_end - 1_000;
            let local_now = (redis_now as i64 + skew) as u64;
            let p = Pauses::in_force_at(&fields, redis_now, local_now);
            let held = p.of("a", local_now).expect("in force 1 s before its end");
            assert_eq!(
                held.until_ms,
                Some((redis_end as i64 + skew) as u64),
                "the end on the replica's clock"
            );
            // Half a second later, on every clock, it still holds; at the
            // end, on every clock, it is over.
            assert!(p.of("a", local_now + 500).is_some(), "skew {skew}");
            assert!(p.of("a", local_now + 1_000).is_none(), "skew {skew}");
            // Read again after Redis' end: gone, whatever the replica's clock.
            let late =
                Pauses::in_force_at(&fields, redis_end + 1, (redis_end as i64 + 1 + skew) as u64);
            assert!(late.is_empty(), "skew {skew}");
        }
    }

    fn pause(until_ms: Option<u64>) -> Pause {
        Pause {
            reason: "incident 42".into(),
            since_ms: 1_000,
            until_ms,
        }
    }

    fn fields(rows: &[(&str, &Pause)]) -> HashMap<String, String> {
        rows.iter()
            .map(|(k, p)| ((*k).to_owned(), p.to_json()))
            .collect()
    }

    #[test]
    fn ended_and_foreign_fields_are_not_in_force() {
        let mut f = fields(&[
            (&field("a"), &pause(Some(5_000))),
            (&field("b"), &pause(Some(2_000))),
            (&field("c"), &pause(None)),
        ]);
        f.insert("s:d".into(), "not json".into());
        f.insert("stray".into(), pause(None).to_json());
        let p = Pauses::in_force(&f, 3_000);
        let mut paused: Vec<&str> = p.sellers.keys().map(String::as_str).collect();
        paused.sort();
        assert_eq!(paused, ["a", "c"]);
        assert_eq!(p.all, None);
    }

    #[test]
    fn a_seller_named_like_the_fleet_field_is_only_itself() {
        let f = fields(&[(&field(ALL), &pause(None))]);
        let p = Pauses::in_force(&f, 0);
        assert_eq!(p.all, None);
        assert!(p.of("all", 0).is_some());
        assert!(p.of("other", 0).is_none());
    }

    #[test]
    fn the_longer_of_a_sellers_and_the_fleets_pause_holds() {
        let f = fields(&[
            (ALL, &pause(Some(9_000))),
            (&field("a"), &pause(Some(4_000))),
        ]);
        let p = Pauses::in_force(&f, 0);
        assert_eq!(p.of("a", 0).and_then(|p| p.until_ms), Some(9_000));
        assert_eq!(p.of("b", 0).and_then(|p| p.until_ms), Some(9_000));
        // Read later, without a new read of the hash: ends are judged then.
        assert_eq!(p.of("a", 9_000), None);
        let f = fields(&[(ALL, &pause(Some(9_000))), (&field("a"), &pause(None))]);
        let p = Pauses::in_force(&f, 0);
        assert_eq!(p.of("a", 20_000).map(|p| p.until_ms), Some(None));
    }
}
