//! `check-config`: validates the config as a worker would at start, then
//! prints the rules it resolves to, per tier and named seller.

use std::path::Path;

use serde_json::json;

use super::format::table;
use super::{load, OperatorError, Output};
use crate::config;
use crate::limiter::Rule;

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
