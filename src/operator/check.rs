//! `check-config`: validates the config as a worker would at start, then
//! prints the rules it resolves to, per tier and named seller.

use std::path::Path;

use serde_json::{json, Value};

use super::format::table;
use super::{load_noting, OperatorError, Output};
use crate::config::{self, Settings};
use crate::limiter::{Policy, Rule};

/// A named seller as `check-config` shows it.
struct SellerRow {
    seller: String,
    tier: String,
    /// Its own rules; none when it is unlimited.
    own: Vec<String>,
    shadow: Vec<String>,
}

/// `check-config`: validates, then prints the old key names the config
/// uses (each a warning naming the file or variable, the old key and the
/// new one) and the resolved rules per tier and named seller.
pub fn check_config(file: Option<&Path>, out: Output) -> Result<String, OperatorError> {
    let (settings, policy, deprecations) = load_noting(file)?;
    let mut sellers: Vec<&str> = policy.named_sellers().collect();
    sellers.sort_unstable();
    let seller_rows: Vec<SellerRow> = sellers
        .iter()
        .map(|s| {
            let own = match policy.resolve(s) {
                crate::limiter::Resolved::Unlimited => Vec::new(),
                crate::limiter::Resolved::Limited { seller, .. } => rules(seller),
            };
            SellerRow {
                seller: (*s).to_owned(),
                tier: policy.tier_of(s).to_owned(),
                own,
                shadow: rules(policy.shadow(s).0),
            }
        })
        .collect();
    Ok(match out {
        Output::Json => {
            let mut v = check_json(&settings, &policy, &seller_rows);
            v["deprecations"] = deprecations
                .iter()
                .map(|d| json!({"old": d.old, "new": d.new, "source": d.source, "message": d.to_string()}))
                .collect();
            serde_json::to_string_pretty(&v)? + "\n"
        }
        Output::Table => {
            let warnings: String = deprecations
                .iter()
                .map(|d| format!("warning: {d}\n"))
                .collect();
            warnings + &check_table(&settings, &policy, &seller_rows)
        }
    })
}

fn rules(rs: &[Rule]) -> Vec<String> {
    rs.iter().map(ToString::to_string).collect()
}

/// `check-config --json`.
fn check_json(settings: &Settings, policy: &Policy, seller_rows: &[SellerRow]) -> Value {
    let (default, default_shadow) = policy.default_rules();
    json!({
        "valid": true,
        "redis": {"url": config::redact_url(&settings.redis.url), "topology": format!("{:?}", settings.redis.topology), "key_prefix": settings.redis.key_prefix},
        "limits_file": settings.limits.file.as_ref().map(|p| p.display().to_string()),
        "default": {"rules": rules(default), "shadow": rules(default_shadow)},
        "global": {"rules": rules(policy.global()), "shadow": rules(policy.global_shadow())},
        "tiers": policy.tiers().map(|(t, r)| (t.to_owned(), json!({"rules": rules(r), "shadow": rules(policy.tier_shadow(t))}))).collect::<serde_json::Map<_, _>>(),
        "sellers": seller_rows.iter().map(|r| json!({
            "seller": r.seller, "tier": r.tier, "rules": r.own, "shadow": r.shadow,
            "unlimited": r.tier == crate::limiter::policy::UNLIMITED_TIER,
            "max_in_flight": policy.max_in_flight(&r.seller),
        })).collect::<Vec<_>>(),
        "max_in_flight": {"default": policy.default_max_in_flight(), "slot_lease_seconds": policy.slot_lease().as_secs_f64()},
    })
}

/// `check-config`'s text: Redis, the limits file, a table of rules, and
/// the caps of calls in flight where any applies.
fn check_table(settings: &Settings, policy: &Policy, seller_rows: &[SellerRow]) -> String {
    let (default, default_shadow) = policy.default_rules();
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
    for r in seller_rows {
        rows.push(vec![
            r.seller.clone(),
            r.tier.clone(),
            if r.own.is_empty() {
                "unlimited".to_owned()
            } else {
                r.own.join(", ")
            },
            r.shadow.join(", "),
        ]);
    }
    s.push_str(&table(&["SELLER", "TIER", "RULES", "SHADOW"], &rows));
    s.push_str(&in_flight_caps(policy, seller_rows));
    s
}

/// Calls in flight: a line only where a cap applies.
fn in_flight_caps(policy: &Policy, seller_rows: &[SellerRow]) -> String {
    let capped: Vec<String> = seller_rows
        .iter()
        .filter_map(|r| {
            policy
                .max_in_flight(&r.seller)
                .map(|n| format!("{} {n}", r.seller))
        })
        .chain(
            policy
                .default_max_in_flight()
                .map(|n| format!("every other seller {n}")),
        )
        .collect();
    if capped.is_empty() {
        return String::new();
    }
    format!(
        "max_in_flight (fleet-wide): {}; slot lease {}\n",
        capped.join(", "),
        humantime::format_duration(policy.slot_lease())
    )
}
