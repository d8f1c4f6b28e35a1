//! Keys renamed over time: the old name still loads, with a warning, so
//! that a config written for an earlier version keeps working.
//!
//! The renames are one table, [`RENAMED`], applied to the merged config
//! (defaults, file, `limits.file`, environment) before serde reads it: the
//! old key's value moves to the new key, so no section needs an alias and
//! none can be missed. Which layer used an old name is read from the
//! layers one by one, for the warning (and the error when a layer sets
//! the new name too).

use std::fmt;

use super::ConfigError;

/// Old dotted key → new dotted key.
pub const RENAMED: &[(&str, &str)] = &[
    // Caps are named `max_*`.
    ("redis.coalesce_max", "redis.max_coalesced"),
    ("downstream.backoff_max", "downstream.max_backoff"),
    (
        "downstream.outage_probe_max",
        "downstream.max_outage_probe_interval",
    ),
    // Counts say what they count.
    ("redis.unready_after", "redis.unready_after_failures"),
    (
        "downstream.outage_after",
        "downstream.outage_after_failures",
    ),
    // A prefix: the tier topics are `{prefix}.{tier}`.
    ("kafka.retry_topic", "kafka.retry_topic_prefix"),
];

/// Keys this release no longer reads, with what to do instead. Unlike a
/// rename, nothing can carry their value over: a layer that sets one is an
/// error naming the file, the key and why it went.
pub const REMOVED: &[(&str, &str)] = &[(
    "redis.state",
    "this release has one state layout (one hash per seller, what was \"v2\"): remove the key (docs/src/operate/upgrading.md)",
)];

/// The old name of `key`, if it was renamed.
pub(super) fn old_name(key: &str) -> Option<&'static str> {
    RENAMED
        .iter()
        .find(|(_, new)| *new == key)
        .map(|(old, _)| *old)
}

/// An old key name found in a layer; it loaded, under its new name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    pub old: &'static str,
    pub new: &'static str,
    /// The file that used it, or `environment variable THROTTLE__…`.
    pub source: String,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} is deprecated and will be removed; rename it to {}",
            self.source,
            describe(&self.source, self.old),
            describe(&self.source, self.new)
        )
    }
}

/// A key as the source spells it: `THROTTLE__SECTION__KEY` for the
/// environment, the dotted key for a file.
fn describe(source: &str, key: &str) -> String {
    if source.starts_with("environment") {
        format!("{key} ({})", variable(key))
    } else {
        key.to_owned()
    }
}

/// The environment variable that sets `key`.
pub fn variable(key: &str) -> String {
    format!("THROTTLE__{}", key.replace('.', "__").to_ascii_uppercase())
}

/// A layer as it is named in errors, and its keys.
pub(super) type Layer = (String, config::Config);

/// Moves every old key of `merged` to its new name. Each layer that used an
/// old name gives a [`Deprecation`]; a layer setting the new name beside
/// an old one is an error naming both. `layers` leaves out the compiled-in
/// defaults, which set every new name.
pub(super) fn apply(
    merged: &mut config::Map<String, config::Value>,
    layers: &[Layer],
) -> Result<Vec<Deprecation>, ConfigError> {
    for &(key, why) in REMOVED {
        let layer = layers
            .iter()
            .find(|(_, layer)| layer.get::<config::Value>(key).is_ok());
        if let Some((name, _)) = layer {
            return Err(ConfigError {
                file: source_name(name, key),
                key: key.to_owned(),
                problem: format!("{key} was removed: {why}"),
            });
        }
    }
    let mut found = Vec::new();
    for &(old, new) in RENAMED {
        let set = |key: &str| -> Vec<&str> {
            layers
                .iter()
                .filter(|(_, layer)| layer.get::<config::Value>(key).is_ok())
                .map(|(name, _)| name.as_str())
                .collect()
        };
        let with_old = set(old);
        if with_old.is_empty() {
            continue;
        }
        let with_new = set(new);
        if !with_new.is_empty() {
            let mut files = with_old.clone();
            files.extend(&with_new);
            files.dedup();
            return Err(ConfigError {
                file: files.join(" + "),
                key: old.to_owned(),
                problem: format!("both {old} (the old name) and {new} are set; keep only {new}"),
            });
        }
        if let Some(value) = take(merged, old) {
            put(merged, new, value);
        }
        found.extend(with_old.into_iter().map(|name| Deprecation {
            old,
            new,
            source: source_name(name, old),
        }));
    }
    Ok(found)
}

/// The file's name, or the variable that set `old`.
fn source_name(layer: &str, old: &str) -> String {
    if layer == "environment" {
        format!("environment variable {}", variable(old))
    } else {
        layer.to_owned()
    }
}

/// Removes the value at a dotted path of tables.
fn take(map: &mut config::Map<String, config::Value>, path: &str) -> Option<config::Value> {
    match path.split_once('.') {
        None => map.remove(path),
        Some((head, rest)) => match &mut map.get_mut(head)?.kind {
            config::ValueKind::Table(t) => take(t, rest),
            _ => None,
        },
    }
}

/// Sets the value at a dotted path, making the tables on the way.
fn put(map: &mut config::Map<String, config::Value>, path: &str, value: config::Value) {
    match path.split_once('.') {
        None => {
            map.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            let entry = map.entry(head.to_owned()).or_insert_with(|| {
                config::Value::new(None, config::ValueKind::Table(config::Map::new()))
            });
            if !matches!(entry.kind, config::ValueKind::Table(_)) {
                entry.kind = config::ValueKind::Table(config::Map::new());
            }
            if let config::ValueKind::Table(t) = &mut entry.kind {
                put(t, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_maps_each_name_once() {
        let mut seen = std::collections::BTreeSet::new();
        for (old, new) in RENAMED {
            assert!(seen.insert(*old), "{old} twice");
            assert!(seen.insert(*new), "{new} twice, or an old name reused");
            assert_eq!(old.split('.').next(), new.split('.').next(), "same section");
        }
        assert_eq!(
            variable("downstream.outage_after"),
            "THROTTLE__DOWNSTREAM__OUTAGE_AFTER"
        );
    }
}
