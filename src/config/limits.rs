//! `[limits]` as written: the rules of every seller, of tiers and of named
//! sellers, global rules, and the fleet-wide caps of calls in flight. The
//! limiter (`limiter::Policy`) checks the rules and makes them sound; this
//! file checks only what needs another section.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration::human_duration;
use super::error::Invalid;

/// The `[limits]` section as written; `limiter::Policy` validates it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// A separate file holding `[limits]` (the same tables as this
    /// section), merged over the config file and watched for live edits
    /// like it: limits can then come from a Kubernetes ConfigMap while the
    /// rest of the config stays in the image or the environment. A relative
    /// path is taken from the working directory.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Rules of every seller not named in `sellers`.
    #[serde(default)]
    pub default: Vec<RuleConfig>,
    /// Rules over all sellers together, protecting the downstream.
    #[serde(default)]
    pub global: Vec<RuleConfig>,
    /// Named rule sets sellers can refer to.
    #[serde(default)]
    pub tiers: BTreeMap<String, Vec<RuleConfig>>,
    /// Per-seller overrides.
    #[serde(default)]
    pub sellers: BTreeMap<String, SellerConfig>,
    /// The most downstream calls of one seller under way at once, across
    /// every replica, by tier: `default` for sellers under
    /// `limits.default`, else a name of `limits.tiers`. A seller's own
    /// `max_in_flight` wins. Unset: no cap.
    #[serde(default)]
    pub max_in_flight: BTreeMap<String, u32>,
    /// Each seller's weight in the share of this replica's downstream
    /// slots (`downstream.concurrency`) while the downstream is the
    /// bottleneck, by tier: `default` for sellers no tier names, else a
    /// name of `limits.tiers`. A seller's own `weight` wins. A positive
    /// integer; unset: 1. Sellers with ready jobs share the slots in
    /// proportion to their weights, counted in cost units; a share left
    /// unused goes to the others (see the book's "Fair shares of
    /// capacity").
    #[serde(default)]
    pub weight: BTreeMap<String, u32>,
    /// The fraction of this replica's downstream slots guaranteed to each
    /// seller with ready jobs, by tier (`default` or a name of
    /// `limits.tiers`); a seller's own `min_share` wins. At least 0, less
    /// than 1; unset: 0 (no guarantee). A seller below its guaranteed
    /// slots takes the next free slot before any weight is looked at.
    #[serde(default)]
    pub min_share: BTreeMap<String, f64>,
    /// How long a slot of `max_in_flight` stays taken when its replica
    /// never gives it back (killed): longer than `downstream.timeout`, so
    /// a call still under way never loses its slot. Default 30s.
    #[serde(default = "default_slot_lease", deserialize_with = "human_duration")]
    pub slot_lease: Duration,
    /// Sellers' limits learnt from the downstream's 429s (see the book's
    /// "Limits learnt from 429s").
    #[serde(default)]
    pub learn: LearnConfig,
}

/// `[limits.learn]`: a seller whose calls meet 429s has its rules scaled
/// down, fleet-wide, and back up while no 429 comes; never above its
/// configured rules.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnConfig {
    /// Off by default: the configured rules hold as written.
    #[serde(default)]
    pub enabled: bool,
    /// A 429 multiplies the seller's effective rate by this (once per
    /// episode: the calls already under way meet the same limit). In
    /// (0, 1); default 0.9.
    #[serde(default = "default_learn_decrease")]
    pub decrease: f64,
    /// The effective rate never falls below this fraction of the
    /// configured rules. In (0, 1); default 0.05.
    #[serde(default = "default_learn_floor")]
    pub floor: f64,
    /// Without a 429 the effective rate rises back linearly, the whole
    /// configured rate in this time (a 10 % drop comes back in a tenth of
    /// it). Shorter finds a raised downstream limit sooner, and meets its
    /// 429s (and their holds) more often. At least 1s; default 10m.
    #[serde(
        default = "default_learn_recovery",
        deserialize_with = "human_duration"
    )]
    pub recovery: Duration,
}

fn default_learn_decrease() -> f64 {
    0.9
}

fn default_learn_floor() -> f64 {
    0.05
}

fn default_learn_recovery() -> Duration {
    Duration::from_secs(600)
}

impl Default for LearnConfig {
    fn default() -> LearnConfig {
        LearnConfig {
            enabled: false,
            decrease: default_learn_decrease(),
            floor: default_learn_floor(),
            recovery: default_learn_recovery(),
        }
    }
}

fn default_slot_lease() -> Duration {
    Duration::from_secs(30)
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig {
            file: None,
            default: Vec::new(),
            global: Vec::new(),
            tiers: BTreeMap::new(),
            sellers: BTreeMap::new(),
            max_in_flight: BTreeMap::new(),
            weight: BTreeMap::new(),
            min_share: BTreeMap::new(),
            slot_lease: default_slot_lease(),
            learn: LearnConfig::default(),
        }
    }
}

/// One rule; the same shape for every algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub algorithm: String,
    pub limit: u64,
    #[serde(deserialize_with = "human_duration")]
    pub period: Duration,
    #[serde(default)]
    pub burst: Option<u64>,
    /// Decided and counted (`result="shadow_denied"`), but never holds a
    /// job: to try a new limit on live traffic before it bites.
    #[serde(default)]
    pub shadow: bool,
}

/// A seller override: at most one of `tier`, `rules`, `unlimited = true`
/// (none: the default rules), and optionally `max_in_flight`, `weight` and
/// `min_share`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SellerConfig {
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub rules: Option<Vec<RuleConfig>>,
    #[serde(default)]
    pub unlimited: bool,
    /// The most downstream calls of this seller under way at once, across
    /// every replica (wins over its tier's).
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// This seller's weight in the share of this replica's downstream
    /// slots (wins over its tier's `limits.weight`); a positive integer.
    #[serde(default)]
    pub weight: Option<u32>,
    /// The fraction of this replica's downstream slots guaranteed to this
    /// seller while it has ready jobs (wins over its tier's
    /// `limits.min_share`); at least 0, less than 1.
    #[serde(default)]
    pub min_share: Option<f64>,
}

impl LimitsConfig {
    /// A slot's lease outlasts the call holding it: `call_timeout` is
    /// `downstream.timeout`.
    pub(super) fn validate(&self, call_timeout: Duration) -> Result<(), Invalid> {
        if self.slot_lease <= call_timeout {
            return Err(Invalid::new(
                "limits.slot_lease",
                LimitsProblem::SlotLeaseTooShort {
                    lease: self.slot_lease,
                    call_timeout,
                },
            ));
        }
        Ok(())
    }
}

/// What is wrong with a value of `[limits]` that the limiter does not check.
#[derive(Debug, thiserror::Error)]
pub(super) enum LimitsProblem {
    #[error(
        "{} must be longer than downstream.timeout ({}): a call still under way when its lease ends would let another call of its seller take its slot",
        humantime::format_duration(*.lease),
        humantime::format_duration(*.call_timeout)
    )]
    SlotLeaseTooShort {
        lease: Duration,
        call_timeout: Duration,
    },
}
