//! Which rules apply to a seller: the default set, a named tier, the
//! seller's own rules, or none at all (`unlimited`), plus the global rules
//! that protect the downstream from all sellers together.
//!
//! Built once from [`LimitsConfig`]; every rule in a [`Policy`] is valid and
//! every tier a seller names exists. A policy is immutable: reloading limits
//! means building a new one and swapping it in.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConfigError, LimitsConfig, Loaded, RuleConfig, SellerConfig};

use super::rule::{Algorithm, Rule};

/// A non-empty, validated list of rules, checked together in one call.
pub type RuleSet = Arc<[Rule]>;

/// The limits of every seller.
#[derive(Debug, Clone)]
pub struct Policy {
    default: Rules,
    global: Vec<Rule>,
    /// Global rules in shadow mode.
    global_shadow: Vec<Rule>,
    tiers: BTreeMap<String, Rules>,
    sellers: HashMap<String, Entry>,
    /// `limits.max_in_flight.default`: the cap of sellers no entry names.
    default_in_flight: Option<u32>,
    /// `limits.slot_lease`.
    slot_lease: Duration,
}

/// A rule list as configured: the rules that hold jobs, and the rules in
/// shadow mode beside them (decided and counted, never holding a job).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rules {
    enforced: RuleSet,
    shadow: RuleSet,
}

/// A seller the config (or an override) names.
#[derive(Debug, Clone)]
struct Entry {
    limits: SellerLimits,
    shadow: RuleSet,
    /// The `tier` label of its metrics: see [`Policy::tier_of`].
    tier: Arc<str>,
    /// Its `max_in_flight`: its own, else its tier's (or the default's).
    max_in_flight: Option<u32>,
}

/// How soon a seller refused for want of a slot of its `max_in_flight`
/// asks again: slots come back with answers, which no other replica is
/// told of. Short against a call (a slot idles at most this long), long
/// against a coalesced limiter call.
pub const SLOT_POLL: Duration = Duration::from_millis(25);

/// The tier label of sellers under `limits.default`.
pub const DEFAULT_TIER: &str = "default";
/// The tier label of a seller with rules of its own in the config.
pub const OWN_TIER: &str = "seller";
/// The tier label of a seller under a temporary override.
pub const OVERRIDE_TIER: &str = "override";
/// The tier label of a seller configured `unlimited`.
pub const UNLIMITED_TIER: &str = "unlimited";

/// What one seller is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SellerLimits {
    /// No rules; only a downstream 429 block (shared by every replica)
    /// holds the seller.
    Unlimited,
    Rules(RuleSet),
}

/// The rules resolved for one seller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved<'a> {
    Unlimited,
    Limited {
        /// The seller's own rules (from a tier, an override or the default).
        seller: &'a [Rule],
        /// Rules over all sellers together; may be empty.
        global: &'a [Rule],
    },
}

/// A rule or seller entry that cannot be used, with the key it sits at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct InvalidLimits {
    /// Dotted path, e.g. `limits.sellers.seller-7.rules[0].limit`.
    pub key: String,
    pub problem: String,
}

impl Policy {
    /// Validates the `[limits]` section of loaded settings; the error names
    /// the file the offending value came from.
    pub fn load(loaded: &Loaded) -> Result<Policy, ConfigError> {
        Policy::from_config(&loaded.settings.limits).map_err(|e| loaded.error_at(&e.key, e.problem))
    }

    /// Validates the `[limits]` section.
    pub fn from_config(cfg: &LimitsConfig) -> Result<Policy, InvalidLimits> {
        let default = rule_set(&cfg.default, "limits.default")?;
        let (global, global_shadow) = rules(&cfg.global, "limits.global")?;
        let mut tiers = BTreeMap::new();
        for (name, list) in &cfg.tiers {
            let key = format!("limits.tiers.{name}");
            if [DEFAULT_TIER, OWN_TIER, OVERRIDE_TIER, UNLIMITED_TIER].contains(&name.as_str()) {
                return Err(invalid(
                    key,
                    format!("{name:?} is the tier label metrics give to sellers outside any tier; pick another name"),
                ));
            }
            tiers.insert(name.clone(), rule_set(list, &key)?);
        }
        for (tier, &n) in &cfg.max_in_flight {
            let key = format!("limits.max_in_flight.{tier}");
            if tier != DEFAULT_TIER && !tiers.contains_key(tier) {
                let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
                return Err(invalid(
                    key,
                    format!("{tier:?} is neither \"default\" nor a tier of limits.tiers {known:?}"),
                ));
            }
            check_in_flight(n, &key)?;
        }
        let in_flight = &cfg.max_in_flight;
        let mut sellers = HashMap::new();
        for (seller, sc) in &cfg.sellers {
            let key = format!("limits.sellers.{seller}");
            if seller.is_empty() {
                return Err(invalid(key, "a seller id must not be empty"));
            }
            sellers.insert(
                seller.clone(),
                seller_entry(sc, &key, &tiers, &default, in_flight)?,
            );
        }
        Ok(Policy {
            default,
            global,
            global_shadow,
            tiers,
            sellers,
            default_in_flight: in_flight.get(DEFAULT_TIER).copied(),
            slot_lease: cfg.slot_lease,
        })
    }

    /// The most downstream calls of `seller` under way at once across the
    /// fleet (`max_in_flight`), if capped: its own, else its tier's, else
    /// `limits.max_in_flight.default` (an override keeps the seller's).
    pub fn max_in_flight(&self, seller: &str) -> Option<u32> {
        match self.sellers.get(seller) {
            Some(e) => e.max_in_flight,
            None => self.default_in_flight,
        }
    }

    /// The cap of sellers no entry names (`limits.max_in_flight.default`).
    pub fn default_max_in_flight(&self) -> Option<u32> {
        self.default_in_flight
    }

    /// How long a slot stays taken when its replica never gives it back.
    pub fn slot_lease(&self) -> Duration {
        self.slot_lease
    }

    /// The rules that apply to `seller`.
    pub fn resolve(&self, seller: &str) -> Resolved<'_> {
        let own = match self.sellers.get(seller).map(|e| &e.limits) {
            Some(SellerLimits::Unlimited) => return Resolved::Unlimited,
            Some(SellerLimits::Rules(r)) => r,
            None => &self.default.enforced,
        };
        Resolved::Limited {
            seller: own,
            global: &self.global,
        }
    }

    /// The rules in shadow mode for `seller`: its own (beside the rules it
    /// is held to), then the global ones. Both may be empty.
    pub fn shadow(&self, seller: &str) -> (&[Rule], &[Rule]) {
        let own = match self.sellers.get(seller) {
            Some(e) => &e.shadow,
            None => &self.default.shadow,
        };
        (own, &self.global_shadow)
    }

    /// The `tier` label of `seller`'s metrics: the tier it names, or
    /// [`DEFAULT_TIER`], [`OWN_TIER`], [`OVERRIDE_TIER`], [`UNLIMITED_TIER`].
    /// Bounded by the config, like the seller label.
    pub fn tier_of(&self, seller: &str) -> &str {
        self.sellers.get(seller).map_or(DEFAULT_TIER, |e| &e.tier)
    }

    /// This policy with `overrides` in place of the named sellers' rules
    /// (temporary overrides from Redis; they win over the config, shadow
    /// rules included).
    pub fn with_overrides(&self, overrides: &HashMap<String, RuleSet>) -> Policy {
        let mut p = self.clone();
        for (seller, rules) in overrides {
            let max_in_flight = self.max_in_flight(seller);
            p.sellers.insert(
                seller.clone(),
                Entry {
                    limits: SellerLimits::Rules(rules.clone()),
                    shadow: Arc::new([]),
                    tier: OVERRIDE_TIER.into(),
                    max_in_flight,
                },
            );
        }
        p
    }

    /// Sellers the config names: the only ones that get per-seller metric
    /// labels, so label cardinality stays bounded by the config.
    pub fn named_sellers(&self) -> impl Iterator<Item = &str> {
        self.sellers.keys().map(String::as_str)
    }

    pub fn global(&self) -> &[Rule] {
        &self.global
    }

    /// Every tier with its enforced rules.
    pub fn tiers(&self) -> impl Iterator<Item = (&str, &[Rule])> {
        self.tiers
            .iter()
            .map(|(k, v)| (k.as_str(), &v.enforced[..]))
    }

    /// The rules of sellers no entry names: (enforced, shadow).
    pub fn default_rules(&self) -> (&[Rule], &[Rule]) {
        (&self.default.enforced, &self.default.shadow)
    }

    /// A tier's shadow rules (empty for an unknown tier).
    pub fn tier_shadow(&self, tier: &str) -> &[Rule] {
        self.tiers.get(tier).map_or(&[], |t| &t.shadow[..])
    }

    /// The global rules in shadow mode.
    pub fn global_shadow(&self) -> &[Rule] {
        &self.global_shadow
    }
}

fn seller_entry(
    sc: &SellerConfig,
    key: &str,
    tiers: &BTreeMap<String, Rules>,
    default: &Rules,
    in_flight: &BTreeMap<String, u32>,
) -> Result<Entry, InvalidLimits> {
    if let Some(n) = sc.max_in_flight {
        check_in_flight(n, &format!("{key}.max_in_flight"))?;
    }
    let cap = |tier: &str| sc.max_in_flight.or_else(|| in_flight.get(tier).copied());
    let entry = |limits, shadow, tier: &str| Entry {
        limits,
        shadow,
        tier: tier.into(),
        max_in_flight: cap(tier),
    };
    match (sc.unlimited, &sc.tier, &sc.rules) {
        (true, None, None) => Ok(entry(SellerLimits::Unlimited, Arc::new([]), UNLIMITED_TIER)),
        (false, Some(tier), None) => tiers
            .get(tier)
            .map(|r| {
                entry(
                    SellerLimits::Rules(r.enforced.clone()),
                    r.shadow.clone(),
                    tier,
                )
            })
            .ok_or_else(|| {
                let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
                invalid(
                    format!("{key}.tier"),
                    format!("unknown tier {tier:?}; defined tiers: {known:?}"),
                )
            }),
        (false, None, Some(list)) => {
            let r = rule_set(list, &format!("{key}.rules"))?;
            Ok(entry(SellerLimits::Rules(r.enforced), r.shadow, OWN_TIER))
        }
        // Only a cap: the default rules, under the default's tier label.
        (false, None, None) if sc.max_in_flight.is_some() => Ok(entry(
            SellerLimits::Rules(default.enforced.clone()),
            default.shadow.clone(),
            DEFAULT_TIER,
        )),
        (false, None, None) => Err(invalid(
            key.to_owned(),
            "give one of tier = \"…\", rules = [...], unlimited = true or max_in_flight = N",
        )),
        _ => Err(invalid(
            key.to_owned(),
            "give only one of tier, rules and unlimited = true",
        )),
    }
}

/// A `max_in_flight` of at least 1 (0 would hold the seller for ever;
/// leave it out for no cap).
fn check_in_flight(n: u32, key: &str) -> Result<(), InvalidLimits> {
    if n == 0 {
        return Err(invalid(
            key.to_owned(),
            "must be at least 1 (leave it out for no cap; to stop a seller use `limits pause`)",
        ));
    }
    Ok(())
}

fn rule_set(list: &[RuleConfig], key: &str) -> Result<Rules, InvalidLimits> {
    let (enforced, shadow) = rules(list, key)?;
    if enforced.is_empty() {
        return Err(invalid(
            key.to_owned(),
            "needs at least one rule that is not shadow = true (for a seller without limits use unlimited = true)",
        ));
    }
    Ok(Rules {
        enforced: enforced.into(),
        shadow: shadow.into(),
    })
}

/// The valid rules of a list: (enforced, shadow). A rule may not appear
/// twice, not even once enforced and once in shadow: both would keep their
/// state under the same key, and the shadow one would charge the real one.
fn rules(list: &[RuleConfig], key: &str) -> Result<(Vec<Rule>, Vec<Rule>), InvalidLimits> {
    let mut out = Vec::with_capacity(list.len());
    let mut shadow = Vec::new();
    for (i, rc) in list.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let algorithm: Algorithm = rc
            .algorithm
            .parse()
            .map_err(|e| invalid(format!("{at}.algorithm"), e))?;
        let rule = Rule::new(algorithm, rc.limit, rc.period, rc.burst).map_err(|e| {
            use super::rule::RuleError as E;
            let field = match e {
                E::ZeroLimit | E::LimitTooLarge(_) | E::RateTooHigh { .. } | E::LogTooLong(_) => {
                    "limit"
                }
                E::ZeroBurst | E::BurstNotSupported(_) => "burst",
                E::PeriodTooShort(_) | E::PeriodTooLong(_) | E::TooPrecise { .. } => "period",
            };
            invalid(format!("{at}.{field}"), e)
        })?;
        if out.contains(&rule) || shadow.contains(&rule) {
            return Err(invalid(at, "the same rule is listed twice"));
        }
        if rc.shadow {
            shadow.push(rule);
        } else {
            out.push(rule);
        }
    }
    Ok((out, shadow))
}

fn invalid(key: String, problem: impl ToString) -> InvalidLimits {
    InvalidLimits {
        key,
        problem: problem.to_string(),
    }
}
