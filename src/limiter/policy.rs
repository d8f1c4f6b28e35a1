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

use super::learn::LearnTerms;
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
    /// The share of sellers no entry names (`limits.weight.default`,
    /// `limits.min_share.default`).
    default_share: Share,
    /// `limits.slot_lease`.
    slot_lease: Duration,
    /// `limits.learn`, when enabled.
    learn: Option<LearnTerms>,
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
    /// Its share of the downstream slots: its own, else its tier's, else
    /// the default's.
    share: Share,
}

/// A seller's claim on this replica's downstream slots while they are the
/// bottleneck (`limits.weight`, `limits.min_share`); the worker's
/// scheduler shares the slots by it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// At least 1: slots go in proportion to it, counted in cost units.
    pub weight: u32,
    /// In [0, 1): the fraction of the slots guaranteed while it has ready
    /// jobs.
    pub min_share: f64,
}

impl Default for Share {
    /// Weight 1, nothing guaranteed: every seller alike.
    fn default() -> Share {
        Share {
            weight: 1,
            min_share: 0.0,
        }
    }
}

/// The share tables of `[limits]`, by tier.
struct Shares<'a> {
    weight: &'a BTreeMap<String, u32>,
    min_share: &'a BTreeMap<String, f64>,
}

impl Shares<'_> {
    /// The share of a seller with its own `weight` and `min_share` (if
    /// any) in `tier` (`None`: no tier of `limits.tiers`, the default's).
    fn of(&self, tier: Option<&str>, weight: Option<u32>, min_share: Option<f64>) -> Share {
        let by_tier = |t: Option<&str>| {
            (
                self.weight.get(t.unwrap_or(DEFAULT_TIER)).copied(),
                self.min_share.get(t.unwrap_or(DEFAULT_TIER)).copied(),
            )
        };
        let (tier_weight, tier_min) = by_tier(tier);
        let (default_weight, default_min) = by_tier(None);
        Share {
            weight: weight.or(tier_weight).or(default_weight).unwrap_or(1),
            min_share: min_share.or(tier_min).or(default_min).unwrap_or(0.0),
        }
    }
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
        for (tier, &w) in &cfg.weight {
            let key = format!("limits.weight.{tier}");
            check_tier(tier, &key, &tiers)?;
            check_weight(w, &key)?;
        }
        for (tier, &m) in &cfg.min_share {
            let key = format!("limits.min_share.{tier}");
            check_tier(tier, &key, &tiers)?;
            check_min_share(m, &key)?;
        }
        let in_flight = &cfg.max_in_flight;
        let shares = Shares {
            weight: &cfg.weight,
            min_share: &cfg.min_share,
        };
        let mut sellers = HashMap::new();
        let mut claimed = 0.0;
        for (seller, sc) in &cfg.sellers {
            let key = format!("limits.sellers.{seller}");
            if seller.is_empty() {
                return Err(invalid(key, "a seller id must not be empty"));
            }
            claimed += sc.min_share.unwrap_or(0.0);
            if claimed > 1.0 + 1e-9 {
                return Err(invalid(
                    format!("{key}.min_share"),
                    format!("the sellers' own min_share add up to {claimed} (this one included), more than all the slots (1)"),
                ));
            }
            sellers.insert(
                seller.clone(),
                seller_entry(sc, &key, &tiers, &default, in_flight, &shares)?,
            );
        }
        Ok(Policy {
            default,
            global,
            global_shadow,
            tiers,
            sellers,
            default_in_flight: in_flight.get(DEFAULT_TIER).copied(),
            default_share: shares.of(None, None, None),
            slot_lease: cfg.slot_lease,
            learn: learn_terms(&cfg.learn)?,
        })
    }

    /// How sellers' limits learn from 429s (`limits.learn`), when they do.
    pub fn learn(&self) -> Option<LearnTerms> {
        self.learn
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

    /// `seller`'s share of this replica's downstream slots: its own
    /// `weight` and `min_share`, else its tier's, else the default's (an
    /// override keeps the seller's).
    pub fn share(&self, seller: &str) -> Share {
        self.sellers
            .get(seller)
            .map_or(self.default_share, |e| e.share)
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
            let share = self.share(seller);
            p.sellers.insert(
                seller.clone(),
                Entry {
                    limits: SellerLimits::Rules(rules.clone()),
                    shadow: Arc::new([]),
                    tier: OVERRIDE_TIER.into(),
                    max_in_flight,
                    share,
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
    shares: &Shares<'_>,
) -> Result<Entry, InvalidLimits> {
    if let Some(n) = sc.max_in_flight {
        check_in_flight(n, &format!("{key}.max_in_flight"))?;
    }
    if let Some(w) = sc.weight {
        check_weight(w, &format!("{key}.weight"))?;
    }
    if let Some(m) = sc.min_share {
        check_min_share(m, &format!("{key}.min_share"))?;
    }
    let cap = |tier: &str| sc.max_in_flight.or_else(|| in_flight.get(tier).copied());
    fn in_tier<'t>(tiers: &BTreeMap<String, Rules>, tier: &'t str) -> Option<&'t str> {
        tiers.contains_key(tier).then_some(tier)
    }
    let entry = |limits, shadow, tier: &str| Entry {
        limits,
        shadow,
        tier: tier.into(),
        max_in_flight: cap(tier),
        share: shares.of(in_tier(tiers, tier), sc.weight, sc.min_share),
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
        // Only a cap or a share: the default rules, under the default's
        // tier label.
        (false, None, None)
            if sc.max_in_flight.is_some() || sc.weight.is_some() || sc.min_share.is_some() =>
        {
            Ok(entry(
            SellerLimits::Rules(default.enforced.clone()),
            default.shadow.clone(),
            DEFAULT_TIER,
            ))
        }
        (false, None, None) => Err(invalid(
            key.to_owned(),
            "give one of tier = \"…\", rules = [...], unlimited = true, max_in_flight = N, weight = N or min_share = x",
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

/// A key of `limits.weight` or `limits.min_share`: "default" or a tier.
fn check_tier(tier: &str, key: &str, tiers: &BTreeMap<String, Rules>) -> Result<(), InvalidLimits> {
    if tier != DEFAULT_TIER && !tiers.contains_key(tier) {
        let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
        return Err(invalid(
            key.to_owned(),
            format!("{tier:?} is neither \"default\" nor a tier of limits.tiers {known:?}"),
        ));
    }
    Ok(())
}

/// The most a weight may be: far beyond any useful ratio, and small enough
/// that a cost over a weight never loses precision in the scheduler.
pub const MAX_WEIGHT: u32 = 10_000;

/// A weight of 1 to [`MAX_WEIGHT`] (0 would never be served).
fn check_weight(w: u32, key: &str) -> Result<(), InvalidLimits> {
    if w == 0 || w > MAX_WEIGHT {
        return Err(invalid(
            key.to_owned(),
            format!("must be a whole number from 1 to {MAX_WEIGHT} (1: an ordinary seller's share; to stop a seller use `limits pause`)"),
        ));
    }
    Ok(())
}

/// A `min_share` in [0, 1): all the slots to one seller would starve the
/// others.
/// `[limits.learn]` checked, as the scripts' terms (`None`: off).
fn learn_terms(cfg: &crate::config::LearnConfig) -> Result<Option<LearnTerms>, InvalidLimits> {
    let fraction = |x: f64, key: &str, what: &str| {
        if x > 0.0 && x < 1.0 {
            Ok(())
        } else {
            Err(invalid(
                format!("limits.learn.{key}"),
                format!("{x} is not a fraction between 0 and 1 (both excluded): {what}"),
            ))
        }
    };
    fraction(
        cfg.decrease,
        "decrease",
        "a 429 multiplies the effective rate by it",
    )?;
    fraction(
        cfg.floor,
        "floor",
        "the least share of the configured rate a seller keeps",
    )?;
    if cfg.recovery < Duration::from_secs(1) {
        return Err(invalid(
            "limits.learn.recovery".to_owned(),
            format!(
                "{} is shorter than 1s: the effective rate would be back whole before the next 429 could say it is too high",
                humantime::format_duration(cfg.recovery)
            ),
        ));
    }
    Ok(cfg
        .enabled
        .then(|| LearnTerms::new(cfg.floor, cfg.decrease, cfg.recovery)))
}

fn check_min_share(m: f64, key: &str) -> Result<(), InvalidLimits> {
    if !(0.0..1.0).contains(&m) {
        return Err(invalid(
            key.to_owned(),
            format!("{m} is not a fraction of the slots: give at least 0 and less than 1 (0.2 guarantees a fifth)"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(toml: &str) -> LimitsConfig {
        let base = "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[tiers]\nprem = [{ algorithm = \"gcra\", limit = 9, period = \"1s\" }]\n";
        toml::from_str(&format!("{base}{toml}")).expect("valid toml")
    }

    #[test]
    fn a_share_is_the_sellers_own_else_its_tiers_else_the_defaults() {
        let cfg = limits(
            "[weight]\nprem = 4\ndefault = 2\n[min_share]\nprem = 0.2\n[sellers]\n\
             p = { tier = \"prem\" }\n\
             own = { tier = \"prem\", weight = 7, min_share = 0.1 }\n\
             w = { weight = 3 }\n\
             u = { unlimited = true }\n",
        );
        let policy = Policy::from_config(&cfg).expect("valid limits");
        // (seller, weight, min_share)
        let cases: &[(&str, u32, f64)] = &[
            ("p", 4, 0.2),
            ("own", 7, 0.1),
            ("w", 3, 0.0),
            ("u", 2, 0.0),
            ("unnamed", 2, 0.0),
        ];
        for &(seller, weight, min_share) in cases {
            assert_eq!(
                policy.share(seller),
                Share { weight, min_share },
                "{seller}"
            );
        }
        let none = Policy::from_config(&limits("")).expect("valid limits");
        assert_eq!(none.share("anyone"), Share::default());
    }
}
