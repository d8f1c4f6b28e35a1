//! `limits pause` and `limits resume`: an operator's pause of one seller
//! or of all, kept in Redis' pauses hash, which every replica reads within
//! a second; and the pauses in force, for `limits show` and `limits list`.

use std::path::Path;

use serde_json::{json, Value};

use super::end::End;
use super::format::rfc3339;
use super::{load, OperatorError, Output};
use crate::config::Settings;
use crate::limiter::pauses::{self, Pause, Pauses};
use crate::limiter::{KeySpace, RedisStore};

/// A pause as JSON: its reason, start and end.
pub(super) fn pause_json(p: &Pause) -> Value {
    json!({
        "reason": p.reason,
        "since": rfc3339(p.since_ms),
        "until": p.until_ms.map(rfc3339),
    })
}

/// A pause in words: `until T, since S (reason)`.
pub(super) fn pause_text(p: &Pause) -> String {
    let end = match p.until_ms {
        Some(u) => format!("until {}", rfc3339(u)),
        None => "until resumed".to_owned(),
    };
    let why = if p.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", p.reason)
    };
    format!("{end}, since {}{why}", rfc3339(p.since_ms))
}

/// The field a pause of `seller` (or, `None`, of every seller) is kept in.
fn pause_field(seller: Option<&str>) -> String {
    seller.map_or_else(|| pauses::ALL.to_owned(), pauses::field)
}

/// `seller S` or `every seller`, for a sentence.
fn who(seller: Option<&str>) -> String {
    seller.map_or_else(|| "every seller".to_owned(), |s| format!("seller {s}"))
}

/// `limits pause SELLER|--all [--for D | --until T] [--reason TEXT]`: every
/// replica stops calling the downstream for it within a second (the
/// workers read the pauses every [`pauses::REFRESH`]). With `dry_run`,
/// says what it would write and writes nothing.
pub async fn pause(
    file: Option<&Path>,
    seller: Option<&str>,
    end: Option<End>,
    reason: &str,
    dry_run: bool,
    out: Output,
) -> Result<String, OperatorError> {
    let (settings, _) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).pauses();
    // On Redis' clock, which every replica judges the end by
    // (`limiter::pauses`), not this host's.
    let now = store.time_ms().await?;
    let p = Pause {
        reason: reason.to_owned(),
        since_ms: now,
        until_ms: end.map(|e| e.at(now)).transpose()?,
    };
    let field = pause_field(seller);
    if !dry_run {
        store.set_field(&key, &field, &p.to_json()).await?;
    }
    Ok(match out {
        Output::Json => {
            let mut v = pause_json(&p);
            v["seller"] = seller.map_or(Value::Null, Value::from);
            v["all"] = Value::from(seller.is_none());
            if dry_run {
                v["dry_run"] = Value::from(true);
                v["key"] = Value::from(key);
                v["field"] = Value::from(field);
            }
            v.to_string() + "\n"
        }
        Output::Table if dry_run => format!(
            "dry run: would pause {}: {} (HSET {key} {field} {}); nothing written\n",
            who(seller),
            pause_text(&p),
            p.to_json()
        ),
        Output::Table => format!(
            "paused {}: {} (on every replica within a second)\n",
            who(seller),
            pause_text(&p)
        ),
    })
}

/// `limits resume SELLER|--all`: ends the pause; jobs held in memory go
/// within a second, those parked in the retry tiers within a minute.
pub async fn resume(
    file: Option<&Path>,
    seller: Option<&str>,
    out: Output,
) -> Result<String, OperatorError> {
    let (settings, _) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).pauses();
    let n = store.delete_fields(&key, &[pause_field(seller)]).await?;
    Ok(match out {
        Output::Json => {
            json!({"seller": seller, "all": seller.is_none(), "resumed": n > 0}).to_string() + "\n"
        }
        Output::Table if n > 0 => format!("resumed {}\n", who(seller)),
        Output::Table => format!("{} was not paused\n", who(seller)),
    })
}

/// The pauses in force, the fleet's first (`None`), then by seller. Ended
/// ones are removed here, by the operator's tool.
pub(super) async fn paused_in_force(
    store: &RedisStore,
    settings: &Settings,
    now: u64,
) -> Result<Vec<(Option<String>, Pause)>, OperatorError> {
    let key = KeySpace::new(settings.redis.key_prefix.clone()).pauses();
    let fields = store.read_hash(&key).await?;
    let live = Pauses::in_force(&fields, now);
    let ended: Vec<String> = fields
        .keys()
        .filter(|f| {
            let seller = f.strip_prefix("s:");
            let held = match seller {
                Some(s) => live.sellers.contains_key(s),
                None => *f == pauses::ALL && live.all.is_some(),
            };
            !held
        })
        .cloned()
        .collect();
    store.delete_fields(&key, &ended).await?;
    let mut out: Vec<(Option<String>, Pause)> = live.all.into_iter().map(|p| (None, p)).collect();
    let mut sellers: Vec<(String, Pause)> = live.sellers.into_iter().collect();
    sellers.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(sellers.into_iter().map(|(s, p)| (Some(s), p)));
    Ok(out)
}
