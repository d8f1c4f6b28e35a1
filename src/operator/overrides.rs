//! `limits override` (set and clear) and `limits list`: an operator's
//! temporary rule for a seller, kept in Redis' overrides hash, which every
//! replica reads within a second; the list shows the pauses too.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::end::End;
use super::format::{rfc3339, rule_json, table};
use super::pauses::{pause_json, paused_in_force};
use super::{load, now_ms, OperatorError, Output};
use crate::limiter::overrides::{self, Override};
use crate::limiter::pauses::Pause;
use crate::limiter::{KeySpace, RedisStore};

/// `limits override SELLER --rule SPEC --for|--until`: the seller gets
/// that rule in place of its configured ones, on every replica within a
/// second, until it expires.
pub async fn set_override(
    file: Option<&Path>,
    seller: &str,
    rule: &str,
    end: End,
    out: Output,
) -> Result<String, OperatorError> {
    // A bad rule is refused before anything is asked of Redis.
    overrides::parse_rule(rule, u64::MAX)
        .and_then(|o| o.rule())
        .map_err(OperatorError::Rule)?;
    let (settings, _) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    // On Redis' clock, which every replica judges the end by.
    let until_ms = end.at(store.time_ms().await?)?;
    let o = overrides::parse_rule(rule, until_ms).map_err(OperatorError::Rule)?;
    let rule = o.rule().map_err(OperatorError::Rule)?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).overrides();
    store.set_field(&key, seller, &o.to_json()).await?;
    Ok(match out {
        Output::Json => {
            json!({"seller": seller, "rule": rule_json(&rule), "until": rfc3339(until_ms)})
                .to_string()
                + "\n"
        }
        Output::Table => format!(
            "{seller}: {rule} until {} (on every replica within {:?})\n",
            rfc3339(until_ms),
            overrides::REFRESH
        ),
    })
}

/// `limits override --clear SELLER`.
pub async fn clear_override(
    file: Option<&Path>,
    seller: &str,
    out: Output,
) -> Result<String, OperatorError> {
    let (settings, _) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).overrides();
    let n = store
        .delete_fields(&key, std::slice::from_ref(&seller.to_owned()))
        .await?;
    Ok(match out {
        Output::Json => json!({"seller": seller, "cleared": n > 0}).to_string() + "\n",
        Output::Table => format!(
            "{seller}: {}\n",
            if n > 0 {
                "override cleared"
            } else {
                "had no override"
            }
        ),
    })
}

/// `limits list`: the overrides in force. Expired fields are dropped here,
/// by the operator's tool, not by every worker every second.
pub async fn list(file: Option<&Path>, out: Output) -> Result<String, OperatorError> {
    let (settings, _) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).overrides();
    let fields: HashMap<String, String> = store.read_hash(&key).await?;
    let now = now_ms();
    let mut expired = Vec::new();
    let mut live: Vec<(String, Override)> = Vec::new();
    for (seller, raw) in fields {
        match serde_json::from_str::<Override>(&raw) {
            Ok(o) if o.until_ms > now => live.push((seller, o)),
            _ => expired.push(seller),
        }
    }
    store.delete_fields(&key, &expired).await?;
    live.sort_by(|a, b| a.0.cmp(&b.0));
    let paused = paused_in_force(&store, &settings, now).await?;
    Ok(match out {
        Output::Json => {
            let mut rows: Vec<Value> = live
                .iter()
                .map(|(seller, o)| {
                    json!({
                        "kind": "override",
                        "seller": seller,
                        "rule": o.rule().map(|r| rule_json(&r)).unwrap_or(Value::Null),
                        "until": rfc3339(o.until_ms),
                    })
                })
                .collect();
            rows.extend(paused.iter().map(|(seller, p)| {
                let mut v = pause_json(p);
                v["kind"] = Value::from("pause");
                v["seller"] = seller.as_deref().map_or(Value::Null, Value::from);
                v["all"] = Value::from(seller.is_none());
                v
            }));
            serde_json::to_string_pretty(&rows)? + "\n"
        }
        Output::Table => list_table(&live, &paused),
    })
}

/// The overrides in force, then the pauses, if any.
fn list_table(live: &[(String, Override)], paused: &[(Option<String>, Pause)]) -> String {
    let mut s = overrides_table(live);
    if !paused.is_empty() {
        let rows: Vec<Vec<String>> = paused
            .iter()
            .map(|(seller, p)| {
                vec![
                    seller.clone().unwrap_or_else(|| "(all sellers)".to_owned()),
                    p.until_ms.map_or_else(|| "resumed".to_owned(), rfc3339),
                    rfc3339(p.since_ms),
                    p.reason.clone(),
                ]
            })
            .collect();
        s.push_str("\npaused:\n");
        s.push_str(&table(&["SELLER", "UNTIL", "SINCE", "REASON"], &rows));
    }
    s
}

/// The overrides in force, or a line saying there is none.
fn overrides_table(live: &[(String, Override)]) -> String {
    match live {
        [] => "no overrides in force\n".to_owned(),
        live => {
            let rows: Vec<Vec<String>> = live
                .iter()
                .map(|(seller, o)| {
                    vec![
                        seller.clone(),
                        o.rule()
                            .map_or_else(|e| format!("invalid: {e}"), |r| r.to_string()),
                        rfc3339(o.until_ms),
                    ]
                })
                .collect();
            table(&["SELLER", "RULE", "UNTIL"], &rows)
        }
    }
}
