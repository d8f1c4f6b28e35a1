//! The commands about one seller's limiter state: `limits show` (its
//! rules, override, pause, slots and each rule's state), `limits peek`
//! (what the limiter would answer now) and `limits reset` (its state
//! cleared). None of them charges the seller.

use std::path::Path;

use serde_json::{json, Value};

use super::format::{rfc3339, rule_json, secs, short, table};
use super::pauses::{pause_json, pause_text};
use super::{now_ms, open_limiter, OperatorError, Output};
use crate::limiter::inspect::SellerState;
use crate::limiter::overrides::Override;
use crate::limiter::{Decision, Limiter, Mode, RedisStore, Request};

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

/// `limits show --json`: without the pause and the slots, which `show` adds.
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

/// `limits show`'s table: without the pause and the slots, which `show` adds.
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
/// With `dry_run`, lists the keys it would delete and which hold state,
/// and deletes nothing.
pub async fn reset(
    file: Option<&Path>,
    seller: &str,
    dry_run: bool,
    out: Output,
) -> Result<String, OperatorError> {
    let limiter = open_limiter(file).await?;
    let keys = limiter.seller_keys(seller);
    if dry_run {
        let held = limiter.store().existing(&keys).await?;
        return Ok(reset_plan(seller, &keys, &held, out));
    }
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

/// `limits reset --dry-run`: the keys a reset would delete.
fn reset_plan(seller: &str, keys: &[String], held: &[String], out: Output) -> String {
    match out {
        Output::Json => {
            json!({
                "seller": seller, "dry_run": true, "keys": keys, "held_state": held,
            })
            .to_string()
                + "\n"
        }
        Output::Table => {
            let mut s = format!(
                "dry run: reset {seller} would delete {} keys ({} hold state now); nothing changed\n",
                keys.len(),
                held.len()
            );
            for k in keys {
                let state = if held.contains(k) {
                    "holds state"
                } else {
                    "empty"
                };
                s.push_str(&format!("  {k}  ({state})\n"));
            }
            s
        }
    }
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
