//! Which state layout a replica runs (`redis.state`), and the install's
//! layout marker.
//!
//! New installs run `v2`. An install that ran an older release is on `v1`,
//! and a `v2` replica starting beside its state would start every seller
//! fresh: one window over-admitted, and more while `v1` replicas run beside
//! it. So when `redis.state` is not set, the layout is the install's own:
//!
//! 1. `redis.state` set: it, always.
//! 2. else the marker `{key_prefix}:layout` (written by every worker at
//!    start with the layout it runs): what the install last ran.
//! 3. else v1 state under the prefix (a key `{prefix}:{tag}:…` that is not a
//!    seller's v2 hash, found by a bounded `SCAN`): an install of a release
//!    before the marker existed, `v1`.
//! 4. else nothing found: a new install, `v2`.
//!
//! A `SCAN` that fails (an ACL without `+scan`) counts as v1 state found:
//! the safe side. A `SCAN` that runs out of its budget before it finds any
//! counts as none found: a Redis shared with millions of other keys may
//! hide an older install's state, which is why the README tells operators
//! of older installs to set `redis.state = "v1"` before upgrading.
//!
//! The decision is [`choose`], apart from Redis; `RedisStore::layout_facts`
//! and `RedisStore::mark_layout` read and write.

use super::keys::StateLayout;

/// Why a layout was chosen, for the startup log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `redis.state` says so.
    Configured,
    /// Not configured; the install's marker says so.
    Marker,
    /// Not configured, no marker, and v1 state found (or Redis could not
    /// tell): an install of an older release.
    OlderInstall,
    /// Not configured, no marker, no state: a new install.
    NewInstall,
}

impl Why {
    /// Words for the log line.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Configured => "redis.state is set",
            Why::Marker => "redis.state is not set; the install's layout marker says so",
            Why::OlderInstall => {
                "redis.state is not set and this install has v1 state (an older release): staying on v1; to move to v2, roll through redis.state = \"v1+v2\" (README \"Limiter state\")"
            }
            Why::NewInstall => "redis.state is not set and this install has no state yet: v2",
        }
    }
}

/// What Redis says about the install, for [`choose`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The marker's value, `None` when there is none.
    pub marker: Option<String>,
    /// v1 state found under the prefix (or Redis could not tell).
    pub v1_state: bool,
}

/// A marker this release cannot read (written by a newer one).
#[derive(Debug, thiserror::Error)]
#[error("redis.state is not set, and the layout marker {key} says {value:?}, which this release does not know: set redis.state")]
pub struct UnknownMarker {
    pub key: String,
    pub value: String,
}

/// Why the layout could not be chosen.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("reading or writing the layout marker: {0}")]
    Redis(#[from] super::redis::RedisError),
    #[error(transparent)]
    Unknown(#[from] UnknownMarker),
}

/// The layout a replica runs under `prefix`, logged with why. A worker
/// (`mark`) then records it in the marker, so that the install keeps it
/// when `redis.state` is left unset later; the operator commands only read.
pub async fn resolve(
    store: &super::redis::RedisStore,
    prefix: &str,
    configured: Option<StateLayout>,
    mark: bool,
) -> Result<StateLayout, LayoutError> {
    let facts = match configured {
        // No need to ask Redis anything.
        Some(_) => Facts {
            marker: None,
            v1_state: false,
        },
        None => store.layout_facts(prefix).await?,
    };
    let (layout, why) = choose(prefix, configured, &facts)?;
    tracing::info!(
        layout = marker_value(layout),
        why = why.describe(),
        "limiter state layout"
    );
    if mark && facts.marker.as_deref() != Some(marker_value(layout)) {
        store.mark_layout(prefix, layout).await?;
    }
    Ok(layout)
}

/// The marker's key.
pub fn marker_key(prefix: &str) -> String {
    format!("{prefix}:layout")
}

/// The marker's value for a layout (as `redis.state` spells it).
pub fn marker_value(layout: StateLayout) -> &'static str {
    match layout {
        StateLayout::V1 => "v1",
        StateLayout::V2 => "v2",
        StateLayout::V1V2 => "v1+v2",
    }
}

fn parse(value: &str) -> Option<StateLayout> {
    [StateLayout::V1, StateLayout::V2, StateLayout::V1V2]
        .into_iter()
        .find(|&l| marker_value(l) == value)
}

/// Whether `key` (under `prefix`) is v1 state: a seller's or the global
/// rules' key (`{prefix}:{tag}:…`) other than a v2 hash (`…}:v2`). The
/// overrides and pauses hashes (`{prefix}:{overrides}`) and the marker are
/// in every layout.
pub fn is_v1_state(prefix: &str, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix(":{")) else {
        return false;
    };
    match rest.find("}:") {
        Some(i) => &rest[i + 2..] != "v2",
        None => false,
    }
}

/// The layout to run (see the module's doc for the order).
pub fn choose(
    prefix: &str,
    configured: Option<StateLayout>,
    facts: &Facts,
) -> Result<(StateLayout, Why), UnknownMarker> {
    if let Some(layout) = configured {
        return Ok((layout, Why::Configured));
    }
    if let Some(value) = &facts.marker {
        return match parse(value) {
            Some(layout) => Ok((layout, Why::Marker)),
            None => Err(UnknownMarker {
                key: marker_key(prefix),
                value: value.clone(),
            }),
        };
    }
    if facts.v1_state {
        return Ok((StateLayout::V1, Why::OlderInstall));
    }
    Ok((StateLayout::V2, Why::NewInstall))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(marker: Option<&str>, v1_state: bool) -> Facts {
        Facts {
            marker: marker.map(str::to_owned),
            v1_state,
        }
    }

    /// Numbered rows: configured, marker, v1 state seen → layout, why.
    #[test]
    fn the_layout_is_the_setting_then_the_marker_then_what_redis_holds() {
        use StateLayout::*;
        let rows = [
            (1, Some(V1), Some("v2"), false, V1, Why::Configured),
            (2, Some(V2), None, true, V2, Why::Configured),
            (3, Some(V1V2), Some("v1"), true, V1V2, Why::Configured),
            (4, None, Some("v1"), false, V1, Why::Marker),
            (5, None, Some("v1+v2"), true, V1V2, Why::Marker),
            (6, None, Some("v2"), true, V2, Why::Marker),
            (7, None, None, true, V1, Why::OlderInstall),
            (8, None, None, false, V2, Why::NewInstall),
        ];
        for (row, configured, marker, v1, want, why) in rows {
            let got = choose("tw", configured, &facts(marker, v1)).expect("a known marker");
            assert_eq!(got, (want, why), "row {row}");
        }
    }

    #[test]
    fn an_unknown_marker_asks_for_the_setting() {
        let err = choose("tw", None, &facts(Some("v3"), false)).unwrap_err();
        assert!(err.to_string().contains("tw:layout"), "{err}");
        // A setting needs no marker at all.
        assert!(choose("tw", Some(StateLayout::V2), &facts(Some("v3"), false)).is_ok());
    }

    #[test]
    fn v1_state_is_any_tagged_key_but_a_v2_hash() {
        for (key, v1) in [
            ("tw:{s1}:block", true),
            ("tw:{s1}:fixed_window:30:10000000:30", true),
            ("tw:{*global*}:gcra:5:1000000:5", true),
            ("tw:{s1}:v2", false),
            ("tw:{*global*}:v2", false),
            ("tw:{overrides}", false),
            ("tw:{pauses}", false),
            ("tw:layout", false),
            ("twx:{s1}:block", false),
        ] {
            assert_eq!(is_v1_state("tw", key), v1, "{key}");
        }
    }
}
