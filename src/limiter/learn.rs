//! Per-seller limits learnt from the downstream's 429s (`limits.learn`).
//!
//! A seller whose calls keep meeting 429s has its rules scaled down
//! multiplicatively, fleet-wide, and scaled back up additively in time
//! while no 429 comes. The state is one field of the seller's hash
//! (`learn`, see `lua/learn.lua`), so every replica reads the same
//! effective rule in the same script call that decides: a drop one replica
//! makes holds every replica at once, and no replica can run on an older
//! factor than another.
//!
//! - The drop comes with the 429's block (`lua/block.lua`), one per 429
//!   episode: a 429 met by a call that started before the last drop was
//!   decided under the old factor, and does not lower it again.
//! - The rise is computed where the factor is read, from the time since
//!   the drop: no success costs a Redis write.
//! - The effective rule never exceeds the configured one, and never falls
//!   below `floor` of it. The factor names the rules it was learnt for: an
//!   edit, an override or a tier change starts afresh.
//!
//! This file holds the terms as data, the fingerprints that name a
//! seller's rules, and the factor's reading; Redis runs the same reading in
//! `lua/learn.lua`, and `refresh.rs` reads a seller's factor for
//! `limits show`.

use std::time::Duration;

use super::rule::{Algorithm, Rule};

/// Parts per million: the factor's unit, as the scripts count it.
pub const FULL: u64 = 1_000_000;

/// How a seller's limit learns (`limits.learn`), in the scripts' units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnTerms {
    /// The lowest factor, ppm of the configured rule (>= 1).
    pub floor_ppm: u64,
    /// A 429 multiplies the factor by this, ppm (< FULL).
    pub decrease_ppm: u64,
    /// The factor rises by this many ppm per second without a drop (>= 1).
    pub rise_ppm_per_s: u64,
}

impl LearnTerms {
    /// Terms from the settings as written: `floor` and `decrease` in
    /// (0, 1), `recovery` the time to rise from nothing back to the whole
    /// rule (so from the floor in `(1 - floor) * recovery`).
    pub fn new(floor: f64, decrease: f64, recovery: Duration) -> LearnTerms {
        let ppm = |x: f64| ((x * FULL as f64).round() as u64).clamp(1, FULL - 1);
        let secs = recovery.as_secs_f64().max(1e-3);
        LearnTerms {
            floor_ppm: ppm(floor),
            decrease_ppm: ppm(decrease),
            rise_ppm_per_s: ((FULL as f64 / secs).round() as u64).clamp(1, FULL * 1000),
        }
    }

    /// The drop a 429 asks of `lua/block.lua`: `decrease:floor:rise:started:rules`.
    pub fn drop_wire(&self, started_us: Option<u64>, rules: &str) -> String {
        format!(
            "{}:{}:{}:{}:{rules}",
            self.decrease_ppm,
            self.floor_ppm,
            self.rise_ppm_per_s,
            started_us.map(|s| s.to_string()).unwrap_or_default()
        )
    }
}

/// The fingerprints of a seller's own rules, as `lua/learn.lua` joins them
/// (each `algorithm:limit:period_us:burst`, the call's arguments): a
/// factor learnt for other rules is not read.
pub fn digest(rules: &[Rule]) -> String {
    rules
        .iter()
        .map(|r| {
            format!(
                "{}:{}:{}:{}",
                r.algorithm().name(),
                r.limit(),
                r.period_us(),
                r.burst()
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What a 429's block did to the seller's learnt factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learnt {
    /// The factor after the 429, ppm of the configured rules.
    pub factor_ppm: u64,
    /// Whether this 429 lowered it (else it fell already for this episode).
    pub dropped: bool,
}

impl Learnt {
    pub fn factor(&self) -> f64 {
        self.factor_ppm as f64 / FULL as f64
    }
}

/// A downstream block as the store answers it: when it ends (µs on the
/// store's clock), and what it did to the seller's learnt factor (with
/// learning on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub until_us: u64,
    pub learnt: Option<Learnt>,
}

/// A seller's `learn` field as read: the factor set by the last drop, its
/// instant, and the rules it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnState {
    pub factor_ppm: u64,
    pub at_us: u64,
    pub rules: String,
}

impl LearnState {
    /// Reads the field (`f:at:rules`); `None` when it does not parse.
    pub fn parse(v: &str) -> Option<LearnState> {
        let mut parts = v.splitn(3, ':');
        let factor_ppm = parts.next()?.parse().ok()?;
        let at_us = parts.next()?.parse().ok()?;
        let rules = parts.next()?.to_owned();
        Some(LearnState {
            factor_ppm,
            at_us,
            rules,
        })
    }

    /// The factor in force at `now_us` for the rules `digest`, as
    /// `lua/learn.lua`'s `learn_factor` computes it: FULL when learnt for
    /// other rules or risen back whole.
    pub fn factor_at(&self, now_us: u64, rise_ppm_per_s: u64, digest: &str) -> u64 {
        if self.rules != digest || self.factor_ppm >= FULL {
            return FULL;
        }
        let dt = u128::from(now_us.saturating_sub(self.at_us));
        let risen = dt * u128::from(rise_ppm_per_s) / 1_000_000;
        (u128::from(self.factor_ppm) + risen).min(u128::from(FULL)) as u64
    }
}

/// A rule scaled to `factor_ppm` as the scripts scale it for a job of
/// cost 1: limit and burst times the factor, at least 1; a learnt `gcra`
/// or `token_bucket` paces evenly (burst 1, `lua/learn.lua` says why).
pub fn scaled(rule: &Rule, factor_ppm: u64) -> Rule {
    if factor_ppm >= FULL {
        return *rule;
    }
    let scale = |x: u64| (u128::from(x) * u128::from(factor_ppm) / u128::from(FULL)).max(1) as u64;
    let burst = match rule.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => Some(1),
        a => a.uses_burst().then(|| scale(rule.burst().get())),
    };
    Rule::new(
        rule.algorithm(),
        scale(rule.limit().get()),
        rule.period(),
        burst,
    )
    .unwrap_or(*rule)
}

/// A seller's learnt limit as `limits show` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct Learning {
    /// The factor in force now, ppm of the configured rules.
    pub factor_ppm: u64,
    /// When the last 429 lowered it (ms since the epoch).
    pub dropped_at_ms: u64,
    /// Until it is back to the configured rules, at the rise in force.
    pub full_in: Duration,
    /// The seller's own rules as configured, then as they run now.
    pub configured: Vec<Rule>,
    pub effective: Vec<Rule>,
}

impl Learning {
    pub fn factor(&self) -> f64 {
        self.factor_ppm as f64 / FULL as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_read_settings_in_ppm() {
        let t = LearnTerms::new(0.05, 0.9, Duration::from_secs(300));
        assert_eq!(t.floor_ppm, 50_000);
        assert_eq!(t.decrease_ppm, 900_000);
        assert_eq!(t.rise_ppm_per_s, 3_333);
        assert_eq!(
            t.drop_wire(Some(7), "gcra:50:1000000:50"),
            "900000:50000:3333:7:gcra:50:1000000:50"
        );
        assert_eq!(t.drop_wire(None, "x"), "900000:50000:3333::x");
    }

    #[test]
    fn the_factor_rises_in_time_for_its_own_rules_only() {
        let s = LearnState::parse("400000:1000000:gcra:50:1000000:50").unwrap();
        assert_eq!(s.rules, "gcra:50:1000000:50");
        // 10 s at 10,000 ppm/s: +0.1.
        assert_eq!(s.factor_at(11_000_000, 10_000, &s.rules), 500_000);
        assert_eq!(s.factor_at(500_000, 10_000, &s.rules), 400_000);
        assert_eq!(s.factor_at(1_000_000_000, 10_000, &s.rules), FULL);
        assert_eq!(s.factor_at(11_000_000, 10_000, "gcra:60:1000000:60"), FULL);
        assert_eq!(LearnState::parse("garbage"), None);
    }

    #[test]
    fn a_scaled_rule_keeps_its_period_and_at_least_one_unit() {
        let r = Rule::new(Algorithm::Gcra, 50, Duration::from_secs(1), Some(10)).unwrap();
        let s = scaled(&r, 400_000);
        assert_eq!(
            (s.limit().get(), s.burst().get(), s.period()),
            (20, 1, r.period())
        );
        let leaky =
            Rule::new(Algorithm::LeakyBucket, 50, Duration::from_secs(1), Some(10)).unwrap();
        assert_eq!(scaled(&leaky, 400_000).burst().get(), 4);
        assert_eq!(scaled(&leaky, FULL), leaky);
        assert_eq!(scaled(&r, 1).limit().get(), 1);
        assert_eq!(digest(&[r]), "gcra:50:1000000:10");
    }
}
