//! The environment as the loader reads it: `THROTTLE__SECTION__KEY`
//! variables, with two forms the config crate cannot take (secret files and
//! librdkafka's dotted property names) resolved here first.

use super::{ConfigError, KafkaSettings};

/// Keys whose names end in `_file` because their value is a path: their
/// variables are taken as they are, not as secrets to read
/// (`tests/config/reference.rs` checks every such field is listed).
pub const PATH_KEYS: &[&str] = &[
    "REDIS__TLS_CA_FILE",
    "REDIS__TLS_CERT_FILE",
    "REDIS__TLS_KEY_FILE",
];

/// Which librdkafka table an environment variable sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PropertyTable {
    Both,
    Consumer,
    Producer,
}

/// The process environment as the config crate should see it, and the
/// librdkafka properties it sets, which the config crate cannot take.
pub(super) struct Variables {
    /// Every other `THROTTLE__` variable, secret files read.
    pub plain: config::Map<String, String>,
    /// Table, dotted librdkafka name, value.
    properties: Vec<(PropertyTable, String, String)>,
}

impl Variables {
    /// Splits `env`:
    ///
    /// - `THROTTLE__KAFKA__PROPERTIES__SASL_PASSWORD` (or `…__SASL.PASSWORD`)
    ///   sets `sasl.password` in `[kafka.properties]` (likewise
    ///   `CONSUMER_PROPERTIES`, `PRODUCER_PROPERTIES`): librdkafka's names are
    ///   dotted and never hold `_`, so `_` stands for `.`, while the config
    ///   crate would read a dot as a nested table.
    /// - A variable ending in `_FILE` is read from the file it names, as Docker
    ///   and Kubernetes mount secrets: `THROTTLE__REDIS__URL_FILE=/run/secrets/redis-url`
    ///   sets `redis.url`, `THROTTLE__KAFKA__PROPERTIES__SASL_PASSWORD_FILE`
    ///   sets `sasl.password`. The trailing newline is dropped.
    pub fn read(env: impl IntoIterator<Item = (String, String)>) -> Result<Variables, ConfigError> {
        let mut plain = config::Map::new();
        let mut properties = Vec::new();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("THROTTLE__") else {
                continue;
            };
            // `_FILE`, but not a key that names a file itself.
            let (name, value) = match rest.strip_suffix("_FILE") {
                Some(base)
                    if !base.is_empty()
                        && !base.ends_with('_')
                        && !PATH_KEYS.contains(&rest.to_ascii_uppercase().as_str()) =>
                {
                    let secret = std::fs::read_to_string(&value).map_err(|e| ConfigError {
                        file: "environment".into(),
                        key: name.clone(),
                        problem: format!("cannot read the secret file {value}: {e}"),
                    })?;
                    let secret = secret.strip_suffix('\n').unwrap_or(&secret);
                    let secret = secret.strip_suffix('\r').unwrap_or(secret).to_owned();
                    (format!("THROTTLE__{base}"), secret)
                }
                _ => (name, value),
            };
            let upper = name.to_ascii_uppercase();
            let table = [
                ("THROTTLE__KAFKA__PROPERTIES__", PropertyTable::Both),
                (
                    "THROTTLE__KAFKA__CONSUMER_PROPERTIES__",
                    PropertyTable::Consumer,
                ),
                (
                    "THROTTLE__KAFKA__PRODUCER_PROPERTIES__",
                    PropertyTable::Producer,
                ),
            ]
            .into_iter()
            .find(|(prefix, _)| upper.starts_with(prefix));
            match table {
                Some((prefix, table)) => {
                    let key = name[prefix.len()..].to_ascii_lowercase().replace('_', ".");
                    if key.is_empty() {
                        return Err(ConfigError {
                            file: "environment".into(),
                            key: name.clone(),
                            problem: "names no librdkafka property (e.g. …__SASL_PASSWORD)".into(),
                        });
                    }
                    properties.push((table, key, value));
                }
                None => {
                    plain.insert(name, value);
                }
            }
        }
        Ok(Variables { plain, properties })
    }

    /// Sets the environment's librdkafka properties in their tables, over
    /// the files' (the environment is the last layer).
    pub fn set_properties(&self, kafka: &mut KafkaSettings) {
        for (table, key, value) in &self.properties {
            let map = match table {
                PropertyTable::Both => &mut kafka.properties,
                PropertyTable::Consumer => &mut kafka.consumer_properties,
                PropertyTable::Producer => &mut kafka.producer_properties,
            };
            map.insert(key.clone(), value.clone());
        }
    }
}
