//! The operator commands behind `throttle-worker limits …` and
//! `check-config`: each returns its output as text, a table for people or
//! JSON (`--json`) for scripts, and `main` prints it.
//!
//! They read the same config as the workers and talk to the same Redis, so
//! what they show is what every replica enforces: the config's limits with
//! the temporary overrides in force.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::config::{self, Settings};
use crate::limiter::inspect::SellerState;
use crate::limiter::overrides::Override;
use crate::limiter::{Decision, KeySpace, Limiter, Mode, Policy, RedisStore, Request, Rule};

mod end;
mod format;
mod overrides;
mod pauses;

pub use end::{end, End};
use format::{rfc3339, rule_json, secs, short, table};
pub use overrides::{clear_override, list, set_override};
pub use pauses::{pause, resume};
use pauses::{pause_json, pause_text};

/// Why an operator command failed; `main` prints it with its cause.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("invalid configuration")]
    Config(#[source] config::ConfigError),
    #[error(transparent)]
    Redis(#[from] crate::limiter::RedisError),
    #[error(transparent)]
    Layout(#[from] crate::limiter::layout::LayoutError),
    #[error(transparent)]
    Limiter(#[from] crate::limiter::LimiterError<crate::limiter::RedisError>),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("--for")]
    For(#[source] humantime::DurationError),
    #[error("--until")]
    Until(#[source] humantime::TimestampError),
    #[error("give --for DURATION or --until TIME")]
    NoEnd,
    #[error("it would end before it starts")]
    EndsBeforeStart,
    #[error("--rule {0}")]
    Rule(String),
}

/// How a command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Loads and validates the config, as a worker would at start.
pub fn load(file: Option<&Path>) -> Result<(Settings, Policy), OperatorError> {
    let loaded = config::load(file).map_err(OperatorError::Config)?;
    let policy = Policy::load(&loaded).map_err(OperatorError::Config)?;
    Ok((loaded.settings, policy))
}

/// The limiter as the worker sees it: the config's policy with the
/// overrides in force now.
pub async fn open_limiter(file: Option<&Path>) -> Result<Limiter<RedisStore>, OperatorError> {
    let (settings, policy) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let prefix = &settings.redis.key_prefix;
    let layout =
        crate::limiter::layout::resolve(&store, prefix, settings.redis.state, false).await?;
    let limiter = Limiter::new(
        store,
        KeySpace::with_layout(prefix.clone(), layout),
        policy,
        settings.redis.topology,
    );
    limiter.refresh_overrides().await?;
    Ok(limiter)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The seller's override in force, read from the overrides hash.
async fn override_of(
    limiter: &Limiter<RedisStore>,
    seller: &str,
) -> Result<Option<Override>, OperatorError> {
    let fields = limiter
        .store()
        .read_hash(&limiter.keys().overrides())
        .await?;
    Ok(fields
        .get(seller)
        .and_then(|json| serde_json::from_str::<Override>(json).ok())
        .filter(|o| o.until_ms > now_ms() && o.rule().is_ok()))
}

/// `limits show SELLER`: the rules that apply, any override, and each
/// rule's live state, charging nothing.
pub async fn show(file: Option<&Path>, seller: &str, out: Output) -> Result<String, OperatorError> {
    let limiter = open_limiter(file).await?;
    let state = limiter.inspect(seller, None).await?;
    let ov = override_of(&limiter, seller).await?;
    let pause = limiter.refresh_pauses().await?.of(seller, now_ms());
    // Slots of max_in_flight taken now, across the fleet (this host's
    // clock says which leases lapsed).
    let in_flight = match limiter.policy().max_in_flight(seller) {
        Some(max) => {
            let key = limiter.keys().slots(seller);
            let held = limiter.store().count_above(&key, now_ms() * 1000).await?;
            Some((held, max))
        }
        None => None,
    };
    Ok(match out {
        Output::Json => {
            let mut v = show_json(seller, &state, ov.as_ref());
            v["paused"] = pause.as_ref().map_or(Value::Null, pause_json);
            v["in_flight"] = in_flight.map_or(
                Value::Null,
                |(held, max)| json!({ "held": held, "max_in_flight": max }),
            );
            serde_json::to_string_pretty(&v)? + "\n"
        }
        Output::Table => {
            let mut s = show_table(seller, &state, ov.as_ref());
            let mut line = match &pause {
                Some(p) => format!("paused: {}\n", pause_text(p)),
                None => "paused: no\n".to_owned(),
            };
            if let Some((held, max)) = in_flight {
                line.push_str(&format!(
                    "calls in flight: {held} of max_in_flight {max} (slots held across the fleet)\n"
                ));
            }
            // After the header line, before the 429 block's.
            let at = s.find('\n').map_or(s.len(), |i| i + 1);
            s.insert_str(at, &line);
            s
        }
    })
}

fn show_json(seller: &str, state: &SellerState, ov: Option<&Override>) -> Value {
    json!({
        "seller": seller,
        "tier": state.tier,
        "unlimited": state.unlimited,
        "override": ov.map(|o| json!({
            "rule": o.rule().map(|r| rule_json(&r)).unwrap_or(Value::Null),
            "until": rfc3339(o.until_ms),
        })),
        "blocked_for_seconds": state.blocked_for.map(secs),
        "rules": state.rules.iter().map(|r| json!({
            "kind": r.kind.name(),
            "rule": rule_json(&r.rule),
            "remaining": r.remaining,
            "retry_after_seconds": secs(r.retry_after),
            "reset_after_seconds": secs(r.reset_after),
        })).collect::<Vec<_>>(),
    })
}

fn show_table(seller: &str, state: &SellerState, ov: Option<&Override>) -> String {
    let mut s = format!("seller {seller}: tier {}", state.tier);
    if let Some(o) = ov {
        s.push_str(&format!(" (override until {})", rfc3339(o.until_ms)));
    }
    if state.unlimited {
        s.push_str(", unlimited");
    }
    s.push('\n');
    match state.blocked_for {
        Some(d) => s.push_str(&format!("downstream 429 block: {} left\n", short(d))),
        None => s.push_str("downstream 429 block: none\n"),
    }
    if state.rules.is_empty() {
        s.push_str("no rules\n");
        return s;
    }
    let rows: Vec<Vec<String>> = state
        .rules
        .iter()
        .map(|r| {
            vec![
                r.rule.to_string(),
                r.kind.name().to_owned(),
                r.remaining.to_string(),
                short(r.retry_after),
                short(r.reset_after),
            ]
        })
        .collect();
    s.push_str(&table(
        &["RULE", "KIND", "REMAINING", "RETRY-AFTER", "FULL-IN"],
        &rows,
    ));
    s
}

/// `limits reset SELLER`: clears the seller's state under every rule it is
/// held to (shadow rules too) and any 429 block, for every replica at once.
pub async fn reset(
    file: Option<&Path>,
    seller: &str,
    out: Output,
) -> Result<String, OperatorError> {
    let limiter = open_limiter(file).await?;
    let keys = limiter.seller_keys(seller);
    let existed = limiter.store().delete(&keys).await?;
    Ok(match out {
        Output::Json => {
            json!({"seller": seller, "keys": keys.len(), "held_state": existed}).to_string() + "\n"
        }
        Output::Table => format!(
            "reset {seller}: {existed} of its {} keys held state (rules and 429 block); cleared\n",
            keys.len()
        ),
    })
}

/// `limits peek SELLER`: what the limiter would answer now for `cost`,
/// charging nothing.
pub async fn peek(
    file: Option<&Path>,
    seller: &str,
    cost: u64,
    mode: Mode,
    out: Output,
) -> Result<String, OperatorError> {
    let limiter = open_limiter(file).await?;
    let decision = limiter
        .check(Request {
            dry_run: true,
            ..Request::new(seller, cost, mode)
        })
        .await?;
    Ok(match (out, &decision) {
        (Output::Table, _) => format!("{decision:#?}\n"),
        (Output::Json, Decision::Granted(g)) => {
            json!({
                "result": "granted", "granted": g.granted, "remaining": g.remaining,
                "reset_after_seconds": secs(g.reset_after),
            })
            .to_string()
                + "\n"
        }
        (Output::Json, Decision::Denied(d)) => {
            json!({
                "result": "denied", "retry_after_seconds": secs(d.retry_after),
                "remaining": d.remaining, "reset_after_seconds": secs(d.reset_after),
                "by": format!("{:?}", d.by),
            })
            .to_string()
                + "\n"
        }
        (Output::Json, Decision::Never(c)) => {
            json!({
                "result": "never", "reason": c.to_string(),
            })
            .to_string()
                + "\n"
        }
    })
}

/// `check-config`: validates, then prints the resolved rules per tier and
/// named seller.
pub fn check_config(file: Option<&Path>, out: Output) -> Result<String, OperatorError> {
    let (settings, policy) = load(file)?;
    let rules = |rs: &[Rule]| rs.iter().map(ToString::to_string).collect::<Vec<_>>();
    let (default, default_shadow) = policy.default_rules();
    let mut sellers: Vec<&str> = policy.named_sellers().collect();
    sellers.sort_unstable();
    let seller_rows: Vec<(String, String, Vec<String>, Vec<String>)> = sellers
        .iter()
        .map(|s| {
            let own = match policy.resolve(s) {
                crate::limiter::Resolved::Unlimited => Vec::new(),
                crate::limiter::Resolved::Limited { seller, .. } => rules(seller),
            };
            (
                (*s).to_owned(),
                policy.tier_of(s).to_owned(),
                own,
                rules(policy.shadow(s).0),
            )
        })
        .collect();
    Ok(match out {
        Output::Json => {
            serde_json::to_string_pretty(&json!({
                "valid": true,
                "redis": {"url": config::redact_url(&settings.redis.url), "topology": format!("{:?}", settings.redis.topology), "key_prefix": settings.redis.key_prefix},
                "limits_file": settings.limits.file.as_ref().map(|p| p.display().to_string()),
                "default": {"rules": rules(default), "shadow": rules(default_shadow)},
                "global": {"rules": rules(policy.global()), "shadow": rules(policy.global_shadow())},
                "tiers": policy.tiers().map(|(t, r)| (t.to_owned(), json!({"rules": rules(r), "shadow": rules(policy.tier_shadow(t))}))).collect::<serde_json::Map<_, _>>(),
                "sellers": seller_rows.iter().map(|(s, tier, own, shadow)| json!({
                    "seller": s, "tier": tier, "rules": own, "shadow": shadow,
                    "unlimited": tier == crate::limiter::policy::UNLIMITED_TIER,
                    "max_in_flight": policy.max_in_flight(s),
                })).collect::<Vec<_>>(),
                "max_in_flight": {"default": policy.default_max_in_flight(), "slot_lease_seconds": policy.slot_lease().as_secs_f64()},
            }))? + "\n"
        }
        Output::Table => {
            let mut s = String::from("configuration is valid\n");
            s.push_str(&format!(
                "redis: {} ({:?}, key prefix {:?})\n",
                config::redact_url(&settings.redis.url),
                settings.redis.topology,
                settings.redis.key_prefix
            ));
            if let Some(f) = &settings.limits.file {
                s.push_str(&format!("limits file: {}\n", f.display()));
            }
            let mut rows = vec![vec![
                "(default)".to_owned(),
                "default".to_owned(),
                rules(default).join(", "),
                rules(default_shadow).join(", "),
            ]];
            rows.push(vec![
                "(global)".to_owned(),
                "-".to_owned(),
                rules(policy.global()).join(", "),
                rules(policy.global_shadow()).join(", "),
            ]);
            for (tier, r) in policy.tiers() {
                rows.push(vec![
                    format!("(tier {tier})"),
                    tier.to_owned(),
                    rules(r).join(", "),
                    rules(policy.tier_shadow(tier)).join(", "),
                ]);
            }
            for (seller, tier, own, shadow) in &seller_rows {
                rows.push(vec![
                    seller.clone(),
                    tier.clone(),
                    if own.is_empty() {
                        "unlimited".to_owned()
                    } else {
                        own.join(", ")
                    },
                    shadow.join(", "),
                ]);
            }
            s.push_str(&table(&["SELLER", "TIER", "RULES", "SHADOW"], &rows));
            // Calls in flight: only where a cap applies.
            let capped: Vec<String> = sellers
                .iter()
                .filter_map(|seller| {
                    policy
                        .max_in_flight(seller)
                        .map(|n| format!("{seller} {n}"))
                })
                .chain(
                    policy
                        .default_max_in_flight()
                        .map(|n| format!("every other seller {n}")),
                )
                .collect();
            if !capped.is_empty() {
                s.push_str(&format!(
                    "max_in_flight (fleet-wide): {}; slot lease {}\n",
                    capped.join(", "),
                    humantime::format_duration(policy.slot_lease())
                ));
            }
            s
        }
    })
}
