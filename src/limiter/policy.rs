//! Which rules apply to a seller: the default set, a named tier, the
//! seller's own rules, or none at all (`unlimited`), plus the global rules
//! that protect the downstream from all sellers together.
//!
//! Built once from [`LimitsConfig`]; every rule in a [`Policy`] is valid and
//! every tier a seller names exists. A policy is immutable: reloading limits
//! means building a new one and swapping it in.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config::{ConfigError, LimitsConfig, Loaded, RuleConfig, SellerConfig};

use super::rule::{Algorithm, Rule};

/// A non-empty, validated list of rules, checked together in one call.
pub type RuleSet = Arc<[Rule]>;

/// The limits of every seller.
#[derive(Debug, Clone)]
pub struct Policy {
    default: RuleSet,
    global: Vec<Rule>,
    tiers: BTreeMap<String, RuleSet>,
    sellers: HashMap<String, SellerLimits>,
}

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
        let global = rules(&cfg.global, "limits.global")?;
        let mut tiers = BTreeMap::new();
        for (name, list) in &cfg.tiers {
            tiers.insert(
                name.clone(),
                rule_set(list, &format!("limits.tiers.{name}"))?,
            );
        }
        let mut sellers = HashMap::new();
        for (seller, sc) in &cfg.sellers {
            let key = format!("limits.sellers.{seller}");
            if seller.is_empty() {
                return Err(invalid(key, "a seller id must not be empty"));
            }
            sellers.insert(seller.clone(), seller_limits(sc, &key, &tiers)?);
        }
        Ok(Policy {
            default,
            global,
            tiers,
            sellers,
        })
    }

    /// The rules that apply to `seller`.
    pub fn resolve(&self, seller: &str) -> Resolved<'_> {
        let own = match self.sellers.get(seller) {
            Some(SellerLimits::Unlimited) => return Resolved::Unlimited,
            Some(SellerLimits::Rules(r)) => r,
            None => &self.default,
        };
        Resolved::Limited {
            seller: own,
            global: &self.global,
        }
    }

    /// This policy with `overrides` in place of the named sellers' rules
    /// (temporary overrides from Redis; they win over the config).
    pub fn with_overrides(&self, overrides: &HashMap<String, RuleSet>) -> Policy {
        let mut p = self.clone();
        for (seller, rules) in overrides {
            p.sellers
                .insert(seller.clone(), SellerLimits::Rules(rules.clone()));
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

    pub fn tiers(&self) -> impl Iterator<Item = (&str, &[Rule])> {
        self.tiers.iter().map(|(k, v)| (k.as_str(), &v[..]))
    }
}

fn seller_limits(
    sc: &SellerConfig,
    key: &str,
    tiers: &BTreeMap<String, RuleSet>,
) -> Result<SellerLimits, InvalidLimits> {
    match (sc.unlimited, &sc.tier, &sc.rules) {
        (true, None, None) => Ok(SellerLimits::Unlimited),
        (false, Some(tier), None) => tiers
            .get(tier)
            .cloned()
            .map(SellerLimits::Rules)
            .ok_or_else(|| {
                let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
                invalid(
                    format!("{key}.tier"),
                    format!("unknown tier {tier:?}; defined tiers: {known:?}"),
                )
            }),
        (false, None, Some(list)) => Ok(SellerLimits::Rules(rule_set(
            list,
            &format!("{key}.rules"),
        )?)),
        (false, None, None) => Err(invalid(
            key.to_owned(),
            "give one of tier = \"…\", rules = [...] or unlimited = true",
        )),
        _ => Err(invalid(
            key.to_owned(),
            "give only one of tier, rules and unlimited = true",
        )),
    }
}

fn rule_set(list: &[RuleConfig], key: &str) -> Result<RuleSet, InvalidLimits> {
    if list.is_empty() {
        return Err(invalid(
            key.to_owned(),
            "needs at least one rule (for a seller without limits use unlimited = true)",
        ));
    }
    Ok(rules(list, key)?.into())
}

fn rules(list: &[RuleConfig], key: &str) -> Result<Vec<Rule>, InvalidLimits> {
    let mut out = Vec::with_capacity(list.len());
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
        if out.contains(&rule) {
            return Err(invalid(at, "the same rule is listed twice"));
        }
        out.push(rule);
    }
    Ok(out)
}

fn invalid(key: String, problem: impl ToString) -> InvalidLimits {
    InvalidLimits {
        key,
        problem: problem.to_string(),
    }
}
