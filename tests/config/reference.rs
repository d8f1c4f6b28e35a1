//! The configuration reference (docs/src/reference/configuration.md, which
//! `docs::references` generates from the config structs) misses no key and
//! names no variable that does not work: every field of every section is
//! listed (the structs' `deny_unknown_fields` errors name them all, so a
//! field the generator's reading of the source missed fails here), every
//! key of `config/default.toml` too, and every environment variable it
//! gives loads through the real config loader.

use std::collections::{BTreeMap, BTreeSet};

use throttle_worker::config::{load_from, DEFAULT_TOML};

use crate::docs::{config_rows, ConfigRow};

const SECTIONS: [&str; 7] = [
    "kafka",
    "redis",
    "downstream",
    "http",
    "worker",
    "limits",
    "tracing",
];

/// Keys whose value is a table of free-form entries: listed as one row.
const OPEN_TABLES: [&str; 5] = [
    "kafka.properties",
    "kafka.consumer_properties",
    "kafka.producer_properties",
    "limits.tiers",
    "limits.sellers",
];

/// The reference's rows by key.
fn reference() -> BTreeMap<String, ConfigRow> {
    config_rows()
        .into_iter()
        .map(|r| (r.key.clone(), r))
        .collect()
}

/// `config/default.toml` as dotted keys, open tables kept whole.
fn defaults() -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
        match v {
            toml::Value::Table(t) if !OPEN_TABLES.contains(&prefix) => {
                for (k, x) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, x, out);
                }
            }
            other => {
                out.insert(prefix.to_owned(), other.clone());
            }
        }
    }
    let table: toml::Value = toml::from_str(DEFAULT_TOML).expect("defaults parse");
    let mut out = BTreeMap::new();
    walk("", &table, &mut out);
    out
}

/// Every field of a section's struct, from the loader's own refusal of an
/// unknown one ("expected one of `a`, `b`, …").
fn fields_of(section: &str) -> BTreeSet<String> {
    let env = vec![(
        format!("THROTTLE__{}__NO_SUCH_KEY", section.to_uppercase()),
        "1".to_owned(),
    )];
    let err = load_from(None, env)
        .err()
        .unwrap_or_else(|| panic!("an unknown key in [{section}] must be refused"));
    let text = err.to_string();
    // serde says "expected one of `a`, `b`" or, for one field, "expected `a`".
    let list = text
        .split_once("expected one of ")
        .or_else(|| text.split_once("expected "))
        .unwrap_or_else(|| panic!("no field list in {text:?}"))
        .1;
    list.split(", ")
        .map(|f| format!("{section}.{}", f.trim().trim_matches('`')))
        .collect()
}

#[test]
fn every_field_of_every_section_is_in_the_reference() {
    let rows = reference();
    let mut fields = BTreeSet::new();
    for section in SECTIONS {
        fields.extend(fields_of(section));
    }
    // The sections' own fields: a nested struct (`limits.learn`) is
    // listed by its keys, which have more parts.
    let listed: BTreeSet<String> = rows
        .keys()
        .map(|k| k.splitn(3, '.').take(2).collect::<Vec<_>>().join("."))
        .collect();
    let missing: Vec<_> = fields.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&fields).collect();
    assert!(
        missing.is_empty(),
        "config keys missing from the reference: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "the reference lists keys the config does not have: {unknown:?}"
    );
}

#[test]
fn every_key_of_the_defaults_is_in_the_reference() {
    let rows = reference();
    for key in defaults().keys() {
        assert!(
            rows.contains_key(key),
            "{key} (in config/default.toml) is not in the reference"
        );
    }
}

#[test]
fn every_environment_variable_in_the_reference_loads() {
    let rows = reference();
    let defaults = defaults();
    let limits_file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(limits_file.path(), "[limits]\n").unwrap();
    let mut checked = 0;
    for (key, row) in &rows {
        let Some(var) = &row.env else { continue };
        let expected = format!("THROTTLE__{}", key.replace('.', "__").to_uppercase());
        assert_eq!(*var, expected, "{key}: the variable's name");
        // Keys with no default get a value that fits, with the companions
        // they need (a TLS file needs a rediss:// URL, a client certificate
        // its key).
        let pem = limits_file.path().display().to_string();
        let mut env = Vec::new();
        let value = match defaults.get(key) {
            // Empty by default, and a URL when set.
            _ if key == "tracing.otlp_endpoint" => "http://127.0.0.1:4318".to_owned(),
            Some(toml::Value::String(s)) if s.is_empty() => "x".to_owned(),
            Some(toml::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None if key == "limits.file" => pem.clone(),
            // Unset by default: the install's layout (README "Limiter state").
            None if key == "redis.state" => "v2".to_owned(),
            // Unset by default: downstream.timeout.
            None if key == "worker.revoke_wait" => "10s".to_owned(),
            None if key.starts_with("redis.tls_") => {
                env.push((
                    "THROTTLE__REDIS__URL".to_owned(),
                    "rediss://127.0.0.1:6379".to_owned(),
                ));
                if key != "redis.tls_ca_file" {
                    env.push(("THROTTLE__REDIS__TLS_CERT_FILE".to_owned(), pem.clone()));
                    env.push(("THROTTLE__REDIS__TLS_KEY_FILE".to_owned(), pem.clone()));
                }
                pem.clone()
            }
            None => panic!("{key}: no default to try"),
        };
        env.push((var.clone(), value.clone()));
        let loaded =
            load_from(None, env).unwrap_or_else(|e| panic!("{var} = {value:?} does not load: {e}"));
        if key.starts_with("redis.tls_") {
            let r = &loaded.settings.redis;
            let set = match key.as_str() {
                "redis.tls_ca_file" => &r.tls_ca_file,
                "redis.tls_cert_file" => &r.tls_cert_file,
                _ => &r.tls_key_file,
            };
            assert_eq!(
                set.as_deref(),
                Some(limits_file.path()),
                "{key} is a path, kept as given"
            );
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} variables checked");
    // And the check can fail: a misspelt variable is refused.
    assert!(load_from(None, vec![("THROTTLE__KAFKA__BROKER".into(), "x".into())]).is_err());
}
