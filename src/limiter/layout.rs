//! Which state layout a replica runs (`redis.state`), and the install's
//! layout marker.
//!
//! The layout is the configuration's, never a guess from what Redis holds:
//! `redis.state` when set, `v2` when not. Two replicas with the same config
//! run the same layout whatever Redis forgets (a restart without
//! persistence, a failover to a replica that missed writes, an eviction):
//! a layout read from Redis can vanish between two replicas' starts, and
//! two layouts side by side are two limiters, each admitting up to the
//! limit. Moving from `v1` is explicit: `redis.state = "v1+v2"`, then `v2`
//! (the book: docs/src/internals/limiter-state.md).
//!
//! Every worker writes the layout it runs to the marker `{key_prefix}:layout`
//! at start. The marker never chooses a layout. It only stops an unset
//! replica from starting as `v2` beside replicas that run `v1` (an install
//! upgraded without setting `redis.state = "v1"` first, or a fleet whose
//! config differs between replicas): one that finds `v1`, or a value this
//! release does not know (a newer release's layout), refuses to start and
//! names the setting. A lost marker loses that guard only: the layout
//! stays the config's.
//!
//! The decision is [`choose`], apart from Redis; `RedisStore::layout_marker`
//! and `RedisStore::mark_layout` read and write.

use super::keys::StateLayout;

/// Why a layout was chosen, for the startup log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `redis.state` says so.
    Configured,
    /// Not configured: the default, `v2`.
    Default,
}

impl Why {
    /// Words for the log line.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Configured => "redis.state is set",
            Why::Default => "redis.state is not set: v2, the default",
        }
    }
}

/// Why an unset `redis.state` cannot run the default here.
#[derive(Debug, thiserror::Error)]
pub enum MarkerConflict {
    /// A replica of this install ran `v1`.
    #[error("redis.state is not set (v2 by default), but the layout marker {key} says \"v1\": a replica of this install runs the v1 layout, and a v2 replica beside it would be a second limiter (both admitting up to each limit). Set redis.state = \"v1\" to run with it, or move through \"v1+v2\" (the book's \"Upgrading\" page, docs/src/operate/upgrading.md); once no replica runs v1, set redis.state = \"v2\"")]
    V1 { key: String },
    /// A marker this release cannot read (written by a newer one).
    #[error("redis.state is not set, and the layout marker {key} says {value:?}, which this release does not know (a newer release's layout?): set redis.state")]
    Unknown { key: String, value: String },
}

/// Why the layout could not be chosen.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("reading or writing the layout marker: {0}")]
    Redis(#[from] super::redis::RedisError),
    #[error(transparent)]
    Conflict(#[from] MarkerConflict),
}

/// The layout a replica runs under `prefix`, logged with why. A worker
/// (`mark`) then records it in the marker; the operator commands only read.
pub async fn resolve(
    store: &super::redis::RedisStore,
    prefix: &str,
    configured: Option<StateLayout>,
    mark: bool,
) -> Result<StateLayout, LayoutError> {
    let marker = match configured {
        // The setting decides alone: no need to ask Redis anything.
        Some(_) => None,
        None => store.layout_marker(prefix).await?,
    };
    let (layout, why) = choose(prefix, configured, marker.as_deref())?;
    tracing::info!(
        layout = marker_value(layout),
        why = why.describe(),
        "limiter state layout"
    );
    if mark && marker.as_deref() != Some(marker_value(layout)) {
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

/// The layout to run: `configured`, else `v2`; `marker` (the install's
/// marker, when not configured) may only refuse the default.
pub fn choose(
    prefix: &str,
    configured: Option<StateLayout>,
    marker: Option<&str>,
) -> Result<(StateLayout, Why), MarkerConflict> {
    if let Some(layout) = configured {
        return Ok((layout, Why::Configured));
    }
    match marker {
        // `v1+v2` replicas write the v2 state too: a v2 replica beside
        // them is the last step of the rolling deploy, and safe.
        None | Some("v2") | Some("v1+v2") => Ok((StateLayout::V2, Why::Default)),
        Some("v1") => Err(MarkerConflict::V1 {
            key: marker_key(prefix),
        }),
        Some(value) => Err(MarkerConflict::Unknown {
            key: marker_key(prefix),
            value: value.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbered rows: configured, marker → layout, why.
    #[test]
    fn the_layout_is_the_setting_else_v2_whatever_the_marker_says() {
        use StateLayout::*;
        let rows = [
            (1, Some(V1), Some("v2"), V1, Why::Configured),
            (2, Some(V2), None, V2, Why::Configured),
            (3, Some(V1V2), Some("v1"), V1V2, Why::Configured),
            (4, Some(V2), Some("v1"), V2, Why::Configured),
            (5, Some(V1), Some("v3"), V1, Why::Configured),
            // A marker lost with the rest of Redis' data changes nothing.
            (6, None, None, V2, Why::Default),
            (7, None, Some("v2"), V2, Why::Default),
            (8, None, Some("v1+v2"), V2, Why::Default),
        ];
        for (row, configured, marker, want, why) in rows {
            let got = choose("tw", configured, marker).expect("no conflict");
            assert_eq!(got, (want, why), "row {row}");
        }
    }

    #[test]
    fn an_unset_replica_beside_v1_replicas_refuses_to_start_and_names_the_setting() {
        let err = choose("tw", None, Some("v1")).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, MarkerConflict::V1 { .. }), "{err:?}");
        assert!(text.contains("tw:layout"), "{text}");
        assert!(text.contains("redis.state = \"v1\""), "{text}");
    }

    #[test]
    fn an_unknown_marker_asks_for_the_setting() {
        let err = choose("tw", None, Some("v3")).unwrap_err();
        assert!(err.to_string().contains("tw:layout"), "{err}");
        assert!(err.to_string().contains("\"v3\""), "{err}");
    }
}
