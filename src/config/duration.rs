//! Durations in human form (`"250ms"`, `"1m"`, `"1d"`, `"50us"`), for
//! `#[serde(deserialize_with)]`: the error quotes the value and shows the
//! form, and the loader adds the key.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// One duration in human form.
pub(super) fn human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(s.trim()).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?}: {e} (write e.g. \"250ms\", \"1m\", \"1d\")"
        ))
    })
}

/// An optional duration in human form (absent: `None`).
pub(super) fn human_duration_opt<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    human_duration(d).map(Some)
}

/// A list of durations in human form.
pub(super) fn human_durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    list.iter()
        .map(|s| {
            humantime::parse_duration(s.trim()).map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {s:?}: {e} (write e.g. \"5s\", \"1m\", \"1h\")"
                ))
            })
        })
        .collect()
}

/// `"period"` (`None`: as long as a rule's own period asks) or one
/// duration in human form, above zero.
pub(super) fn period_or_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim() == "period" {
        return Ok(None);
    }
    match humantime::parse_duration(s.trim()) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        Ok(_) => Err(serde::de::Error::custom(format!(
            "invalid duration {s:?}: it must be above zero (or \"period\")"
        ))),
        Err(e) => Err(serde::de::Error::custom(format!(
            "invalid duration {s:?}: {e} (write \"period\" or e.g. \"5s\", \"1m\")"
        ))),
    }
}
