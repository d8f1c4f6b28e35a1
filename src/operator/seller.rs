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
use crate::limiter::learn::Learning;
use crate::limiter::overrides::Override;
use crate::limiter::waits::{of_seller, Wait};
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
    // What every replica holds of its jobs, from the wait board.
    let waits = of_seller(&limiter.read_waits(now_ms()).await?, seller);
    let learning = limiter.learning(seller).await?;
    let learns = limiter.policy().learn().is_some();
    Ok(match out {
        Output::Json => {
            let mut v = show_json(seller, &state, ov.as_ref());
            v["learnt"] = learning.as_ref().map_or(Value::Null, learnt_json);
            v["waiting"] = waits_json(&waits);
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
            line.push_str(&learnt_text(learning.as_ref(), learns));
            line.push_str(&waits_text(&waits));
            // After the header line, before the 429 block's.
            let at = s.find('\n').map_or(s.len(), |i| i + 1);
            s.insert_str(at, &line);
            s
        }
    })
}

/// The seller's learnt limit (`limits.learn`), as `limits show --json`
/// gives it.
fn learnt_json(l: &Learning) -> Value {
    json!({
        "factor": l.factor(),
        "last_429": rfc3339(l.dropped_at_ms),
        "full_in_seconds": secs(l.full_in),
        "configured": l.configured.iter().map(rule_json).collect::<Vec<_>>(),
        "effective": l.effective.iter().map(rule_json).collect::<Vec<_>>(),
    })
}

/// The seller's learnt limit, one line, and why: the rules it runs on now
/// against the ones configured.
fn learnt_text(l: Option<&Learning>, learns: bool) -> String {
    let Some(l) = l else {
        return if learns {
            "learnt from 429s: nothing (runs on its configured rules)\n".to_owned()
        } else {
            "learnt from 429s: off (limits.learn.enabled = false)\n".to_owned()
        };
    };
    let list = |rules: &[crate::limiter::Rule]| {
        rules
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "learnt from 429s: runs at {:.2} of its rules since the downstream's 429 at {}, back whole in {}: {} (configured: {})\n",
        l.factor(),
        rfc3339(l.dropped_at_ms),
        short(l.full_in),
        list(&l.effective),
        list(&l.configured),
    )
}

/// The seller's waits, by replica, as `limits show --json` gives them.
fn waits_json(waits: &[(String, Wait)]) -> Value {
    Value::Array(
        waits
            .iter()
            .map(|(worker, w)| {
                json!({
                    "replica": worker,
                    "jobs": w.jobs,
                    "units": w.units,
                    "oldest_seconds": w.oldest_ms as f64 / 1000.0,
                    "drain_seconds": w.drain_ms.map(|d| d as f64 / 1000.0),
                    "held_by": w.held_by,
                })
            })
            .collect(),
    )
}

/// The seller's waits, as `limits show` prints them: the fleet's total,
/// then one line per replica that holds its jobs.
fn waits_text(waits: &[(String, Wait)]) -> String {
    if waits.is_empty() {
        return "waiting: nothing on any replica\n".to_owned();
    }
    let ms = |ms: u64| short(std::time::Duration::from_millis(ms));
    let jobs: usize = waits.iter().map(|(_, w)| w.jobs).sum();
    let units: u64 = waits.iter().map(|(_, w)| w.units).sum();
    let oldest = waits.iter().map(|(_, w)| w.oldest_ms).max().unwrap_or(0);
    // The seller's rate is the fleet's: each replica's backlog drains
    // after the others'.
    let drain: Option<u64> = waits.iter().map(|(_, w)| w.drain_ms).sum();
    let mut s = format!(
        "waiting: {jobs} jobs ({units} units) on {} replica(s), oldest {}, {}\n",
        waits.len(),
        ms(oldest),
        match drain {
            Some(d) => format!("drains in {} at its rate", ms(d)),
            None => "no rule to drain at".to_owned(),
        }
    );
    for (worker, w) in waits {
        s.push_str(&format!(
            "  {worker}: {} jobs, oldest {}, held by {}\n",
            w.jobs,
            ms(w.oldest_ms),
            w.held_by
        ));
    }
    s
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(jobs: usize, oldest_ms: u64, drain_ms: Option<u64>, held_by: &str) -> Wait {
        Wait {
            seller: "acme".to_owned(),
            jobs,
            units: jobs as u64,
            oldest_ms,
            drain_ms,
            held_by: held_by.to_owned(),
        }
    }

    #[test]
    fn the_learnt_limit_prints_configured_against_effective_and_why() {
        use crate::limiter::{Algorithm, Rule};
        use std::time::Duration;
        assert_eq!(
            learnt_text(None, false),
            "learnt from 429s: off (limits.learn.enabled = false)\n"
        );
        assert!(learnt_text(None, true).contains("runs on its configured rules"));
        let rule = Rule::new(Algorithm::Gcra, 50, Duration::from_secs(1), None).unwrap();
        let l = Learning {
            factor_ppm: 400_000,
            dropped_at_ms: 1_700_000_000_000,
            full_in: Duration::from_secs(360),
            configured: vec![rule],
            effective: vec![crate::limiter::learn::scaled(&rule, 400_000)],
        };
        let text = learnt_text(Some(&l), true);
        assert!(
            text.starts_with("learnt from 429s: runs at 0.40 of its rules since the downstream's 429 at 2023-11-14T22:13:20Z, back whole in 6m"),
            "{text}"
        );
        assert!(
            text.contains("gcra 20 per 1s (burst 1)")
                && text.contains("(configured: gcra 50 per 1s)"),
            "{text}"
        );
        let json = learnt_json(&l);
        assert_eq!(json["factor"], 0.4);
        assert_eq!(json["effective"][0]["limit"], 20);
        assert_eq!(json["configured"][0]["limit"], 50);
    }

    #[test]
    fn waits_print_the_fleets_total_then_each_replica() {
        assert_eq!(waits_text(&[]), "waiting: nothing on any replica\n");
        let waits = vec![
            ("w1".to_owned(), wait(12, 95_000, Some(144_000), "rule 0")),
            ("w2".to_owned(), wait(8, 30_000, Some(96_000), "capacity")),
        ];
        let text = waits_text(&waits);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("waiting: 20 jobs (20 units) on 2 replica(s), oldest "),
            "{text}"
        );
        assert!(lines[0].contains("drains in "), "{text}");
        assert!(
            lines[1].contains("w1: 12 jobs") && lines[1].ends_with("held by rule 0"),
            "{text}"
        );
        assert!(lines[2].ends_with("held by capacity"), "{text}");
        let unlimited = vec![("w1".to_owned(), wait(3, 1_000, None, "capacity"))];
        assert!(waits_text(&unlimited).contains("no rule to drain at"));
        let json = waits_json(&waits);
        assert_eq!(json[0]["replica"], "w1");
        assert_eq!(json[0]["oldest_seconds"], 95.0);
        assert_eq!(json[1]["held_by"], "capacity");
    }
}
