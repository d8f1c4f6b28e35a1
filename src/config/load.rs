//! The layered loader: `config/default.toml` (compiled in), then the file
//! from the command line, then the `limits.file` they name, then the
//! environment. Each layer is also kept on its own, to say which one set a
//! key: every error names that file.

use std::fmt;
use std::path::{Path, PathBuf};

use super::env::Variables;
use super::error::Invalid;
use super::renames::{self, Deprecation};
use super::{ConfigError, Settings};

/// The defaults every deployment starts from, compiled in so that the binary
/// runs with no file at all.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Where the compiled-in defaults appear in error messages.
pub const DEFAULT_NAME: &str = "config/default.toml";

/// Loaded settings, with what is needed to say where a value came from.
pub struct Loaded {
    pub settings: Settings,
    /// The old key names the sources used ([`renames::RENAMED`]): they
    /// loaded under the new names; `run` logs these, `check-config` prints them.
    pub deprecations: Vec<Deprecation>,
    /// Each source on its own, in merge order, to find where a key was set.
    layers: Vec<(String, config::Config)>,
}

impl Loaded {
    /// An error about `key`, naming the file its value came from.
    pub fn error_at(&self, key: &str, problem: impl fmt::Display) -> ConfigError {
        ConfigError {
            file: self.origin(key),
            key: key.to_owned(),
            problem: problem.to_string(),
        }
    }

    /// The file (or "environment") that gave `key` its value.
    pub fn origin(&self, key: &str) -> String {
        origin(&self.layers, key)
    }

    /// A section's refusal, naming the file its value came from.
    fn locate(&self, invalid: Invalid) -> ConfigError {
        self.error_at(invalid.key, invalid.problem)
    }
}

/// The last layer that sets `key` (or, for a missing key, its nearest
/// parent) is the one that won the merge. A renamed key counts under its
/// old name too.
fn origin(layers: &[(String, config::Config)], key: &str) -> String {
    let mut probe = key.to_owned();
    loop {
        let sets = |layer: &config::Config, key: &str| layer.get::<config::Value>(key).is_ok();
        let found = layers.iter().rev().find(|(_, layer)| {
            sets(layer, &probe) || renames::old_name(&probe).is_some_and(|old| sets(layer, old))
        });
        if let Some((name, _)) = found {
            return name.clone();
        }
        match probe.rfind(['.', '[']) {
            Some(i) => probe.truncate(i),
            None => return DEFAULT_NAME.to_owned(),
        }
    }
}

/// Loads the defaults, then `file` if given, then the environment.
pub fn load(file: Option<&Path>) -> Result<Loaded, ConfigError> {
    load_from(file, std::env::vars())
}

/// [`load`] with an explicit environment, so tests need not mutate the process's.
pub fn load_from(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Loaded, ConfigError> {
    let defaults = config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml);
    let mut files = vec![DEFAULT_NAME.to_owned()];
    let mut builder = config::Config::builder().add_source(defaults.clone());
    let mut layers = vec![(DEFAULT_NAME.to_owned(), single(defaults, &files)?)];
    if let Some(path) = file {
        let shown = path.display().to_string();
        if !path.exists() {
            return Err(ConfigError {
                file: shown,
                key: "-".into(),
                problem: "no such file".into(),
            });
        }
        let source = config::File::from(PathBuf::from(path)).required(true);
        files.push(shown.clone());
        builder = builder.add_source(source.clone());
        layers.push((shown, single(source, &files)?));
    }
    let variables = Variables::read(env)?;
    let env = config::Environment::with_prefix("THROTTLE")
        .prefix_separator("__")
        .separator("__")
        .try_parsing(true)
        .source(Some(variables.plain.clone()));
    let env_layer = ("environment".to_owned(), single(env.clone(), &files)?);
    let mut loaded = merge(&builder, &env, &files, &layers, &env_layer)?;
    // `limits.file` names a file read after the config file and before the
    // environment, so it is known only once the others are merged.
    if let Some(path) = loaded.settings.limits.file.clone() {
        let shown = path.display().to_string();
        let at = loaded.origin("limits.file");
        if !path.exists() {
            return Err(ConfigError {
                file: at,
                key: "limits.file".into(),
                problem: format!("{shown}: no such file"),
            });
        }
        let source = config::File::new(&shown, config::FileFormat::Toml).required(true);
        files.push(shown.clone());
        let layer = single(source.clone(), &files)?;
        limits_only(&layer, &shown)?;
        builder = builder.add_source(source);
        layers.push((shown, layer));
        loaded = merge(&builder, &env, &files, &layers, &env_layer)?;
    }
    variables.set_properties(&mut loaded.settings.kafka);
    if let Err(invalid) = loaded.settings.validate() {
        return Err(loaded.locate(invalid));
    }
    Ok(loaded)
}

/// The sources so far, then the environment, read into [`Settings`].
fn merge(
    builder: &config::ConfigBuilder<config::builder::DefaultState>,
    env: &config::Environment,
    files: &[String],
    layers: &[(String, config::Config)],
    env_layer: &(String, config::Config),
) -> Result<Loaded, ConfigError> {
    let mut files = files.to_vec();
    files.push("environment".to_owned());
    let mut layers = layers.to_vec();
    layers.push(env_layer.clone());
    let merged = builder
        .clone()
        .add_source(env.clone())
        .build()
        .map_err(|e| from_config_error(e, &files))?;
    // Old key names move to the new ones before serde reads the tree.
    let mut tree = merged
        .try_deserialize::<config::Map<String, config::Value>>()
        .map_err(|e| from_config_error(e, &files))?;
    // The defaults come first (`load_from`), and are left out.
    let deprecations = renames::apply(&mut tree, &layers[1..])?;
    let tree = config::Value::new(None, config::ValueKind::Table(tree));
    let settings: Settings = tree.try_deserialize().map_err(|e| {
        let mut err = from_config_error(e, &files);
        if err.key != "-" {
            err.file = origin(&layers, &err.key);
            // Name the key as that file wrote it.
            if let Some(old) = renames::old_name(&err.key) {
                let wrote_old = layers
                    .iter()
                    .any(|(name, l)| *name == err.file && l.get::<config::Value>(old).is_ok());
                if wrote_old {
                    err.key = old.to_owned();
                }
            }
        }
        err
    })?;
    Ok(Loaded {
        settings,
        deprecations,
        layers,
    })
}

/// A limits file holds `[limits]` and nothing else, and names no further
/// file: any other key would silently change settings that need a restart.
fn limits_only(layer: &config::Config, shown: &str) -> Result<(), ConfigError> {
    let table = layer
        .clone()
        .try_deserialize::<config::Map<String, config::Value>>()
        .map_err(|e| from_config_error(e, &[shown.to_owned()]))?;
    let problem = |key: String, problem: &str| ConfigError {
        file: shown.to_owned(),
        key,
        problem: problem.to_owned(),
    };
    for key in table.keys() {
        if key != "limits" {
            return Err(problem(
                key.clone(),
                "a limits file may hold only [limits] (and its tiers and sellers)",
            ));
        }
    }
    if layer.get::<config::Value>("limits.file").is_ok() {
        return Err(problem(
            "limits.file".to_owned(),
            "a limits file cannot name another limits file",
        ));
    }
    Ok(())
}

/// One source read alone, to answer "who set this key".
fn single<S>(source: S, files: &[String]) -> Result<config::Config, ConfigError>
where
    S: config::Source + Send + Sync + 'static,
{
    config::Config::builder()
        .add_source(source)
        .build()
        .map_err(|e| from_config_error(e, files))
}

/// The config crate's messages end in "for key `x` in file"; keep the
/// problem, and pull out the key (normalised: the crate writes `a[0]b` for
/// `a[0].b`).
fn from_config_error(e: config::ConfigError, files: &[String]) -> ConfigError {
    let text = e.to_string();
    let (problem, key) = match text.split_once(" for key `") {
        Some((problem, rest)) => (
            problem.to_owned(),
            rest.split('`').next().unwrap_or("-").to_owned(),
        ),
        None => (text.clone(), "-".to_owned()),
    };
    let mut normal = String::with_capacity(key.len() + 2);
    let mut prev = ' ';
    for c in key.chars() {
        if prev == ']' && c != '[' && c != '.' {
            normal.push('.');
        }
        normal.push(c);
        prev = c;
    }
    ConfigError {
        file: files.join(" + "),
        key: normal,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::file;

    #[test]
    fn defaults_load_with_no_file() {
        let loaded = load_from(None, Vec::new()).expect("defaults must load");
        assert!(!loaded.settings.limits.default.is_empty());
    }

    #[test]
    fn file_and_environment_override_defaults_in_order() {
        let f = file("[kafka]\ngroup_id = \"from-file\"\ntopic = \"t-file\"\n");
        let env = vec![("THROTTLE__KAFKA__TOPIC".to_owned(), "t-env".to_owned())];
        let s = load_from(Some(f.path()), env).unwrap().settings;
        assert_eq!(s.kafka.group_id, "from-file");
        assert_eq!(s.kafka.topic, "t-env");
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let f = file("[worker]\nmax_bufered = 10\n");
        let err = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("must fail");
        let text = err.to_string();
        assert!(text.contains("max_bufered"), "{text}");
        assert!(text.contains(&f.path().display().to_string()), "{text}");
    }

    #[test]
    fn bad_duration_names_the_key() {
        let f = file("[worker]\nmax_inline_delay = \"soon\"\n");
        let err = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("must fail");
        assert!(err.to_string().contains("max_inline_delay"), "{err}");
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = load_from(Some(Path::new("/nonexistent/x.toml")), Vec::new())
            .err()
            .expect("must fail");
        assert_eq!(err.problem, "no such file");
    }

    #[test]
    fn a_limits_file_is_merged_over_the_config_and_holds_only_limits() {
        let limits = file(
            "[limits]\ndefault = [{ algorithm = \"gcra\", limit = 7, period = \"1s\" }]\n\n[limits.sellers]\n\"b\" = { unlimited = true }\n",
        );
        let cfg = file(&format!(
            "[kafka]\ngroup_id = \"g\"\n\n[limits]\nfile = \"{}\"\n\n[limits.sellers]\n\"a\" = {{ unlimited = true }}\n",
            limits.path().display()
        ));
        let loaded = load_from(Some(cfg.path()), Vec::new()).unwrap();
        let l = &loaded.settings.limits;
        assert_eq!(
            l.default[0].limit, 7,
            "the limits file wins over the config"
        );
        assert_eq!(
            l.sellers.keys().collect::<Vec<_>>(),
            vec!["a", "b"],
            "named sellers of both"
        );
        assert_eq!(loaded.settings.kafka.group_id, "g");
        assert_eq!(
            loaded.origin("limits.default"),
            limits.path().display().to_string()
        );

        // From the environment too.
        let env = vec![(
            "THROTTLE__LIMITS__FILE".to_owned(),
            limits.path().display().to_string(),
        )];
        let loaded = load_from(None, env).unwrap();
        assert_eq!(loaded.settings.limits.default[0].limit, 7);

        // Anything but [limits] in it is refused, naming the file and key.
        let sneaky = file("[kafka]\ngroup_id = \"other\"\n");
        let env = vec![(
            "THROTTLE__LIMITS__FILE".to_owned(),
            sneaky.path().display().to_string(),
        )];
        let e = load_from(None, env).err().unwrap();
        assert_eq!(e.file, sneaky.path().display().to_string());
        assert_eq!(e.key, "kafka");

        // A bad value in it names it.
        let bad = file(
            "[limits]\ndefault = [{ algorithm = \"gcra\", limit = \"many\", period = \"1s\" }]\n",
        );
        let env = vec![(
            "THROTTLE__LIMITS__FILE".to_owned(),
            bad.path().display().to_string(),
        )];
        let e = load_from(None, env).err().unwrap();
        assert_eq!(e.file, bad.path().display().to_string(), "{e}");
        assert!(e.key.starts_with("limits.default"), "{e}");

        // A missing one names where it was set.
        let cfg = file("[limits]\nfile = \"/nonexistent/limits.toml\"\n");
        let e = load_from(Some(cfg.path()), Vec::new()).err().unwrap();
        assert_eq!(e.file, cfg.path().display().to_string());
        assert_eq!(e.key, "limits.file");
        assert!(e.problem.contains("no such file"), "{e}");
    }

    /// Issue 35: an old key name loads, from a file or from its variable,
    /// with a warning naming where, the old key and the new one.
    #[test]
    fn an_old_key_name_loads_with_a_deprecation() {
        let f = file("[downstream]\noutage_after = 7\n\n[kafka]\nretry_topic = \"r\"\n");
        let loaded = load_from(Some(f.path()), Vec::new()).unwrap();
        assert_eq!(loaded.settings.downstream.outage_after_failures, 7);
        assert_eq!(loaded.settings.kafka.retry_topic_prefix, "r");
        let shown = f.path().display().to_string();
        let found: Vec<String> = loaded.deprecations.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            found,
            [
                format!("{shown}: downstream.outage_after is deprecated and will be removed; rename it to downstream.outage_after_failures"),
                format!("{shown}: kafka.retry_topic is deprecated and will be removed; rename it to kafka.retry_topic_prefix"),
            ]
        );

        let env = vec![("THROTTLE__REDIS__COALESCE_MAX".to_owned(), "9".to_owned())];
        let loaded = load_from(None, env).unwrap();
        assert_eq!(loaded.settings.redis.max_coalesced, 9);
        let d = &loaded.deprecations[0];
        assert_eq!(
            (d.old, d.new),
            ("redis.coalesce_max", "redis.max_coalesced")
        );
        let text = d.to_string();
        assert!(
            text.contains("environment variable THROTTLE__REDIS__COALESCE_MAX")
                && text.contains("THROTTLE__REDIS__MAX_COALESCED"),
            "{text}"
        );
        assert!(load_from(None, Vec::new()).unwrap().deprecations.is_empty());
    }

    #[test]
    fn an_old_and_a_new_name_together_are_refused_naming_both() {
        let f = file("[downstream]\nbackoff_max = \"1s\"\nmax_backoff = \"2s\"\n");
        let e = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("both set");
        assert_eq!(e.file, f.path().display().to_string());
        assert!(
            e.to_string().contains("downstream.backoff_max")
                && e.to_string().contains("downstream.max_backoff"),
            "{e}"
        );
        // One in the file, the other in the environment.
        let f = file("[redis]\nunready_after = 2\n");
        let env = vec![(
            "THROTTLE__REDIS__UNREADY_AFTER_FAILURES".to_owned(),
            "3".to_owned(),
        )];
        let e = load_from(Some(f.path()), env).err().expect("both set");
        assert!(e.file.contains("environment"), "{e}");
        assert!(e.problem.contains("redis.unready_after_failures"), "{e}");
    }

    /// A bad value under an old name is blamed on the file that wrote it.
    #[test]
    fn a_bad_value_under_an_old_name_names_its_file() {
        let f = file("[downstream]\noutage_probe_max = \"soon\"\n");
        let e = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("bad duration");
        assert_eq!(e.file, f.path().display().to_string(), "{e}");
        assert!(e.problem.contains("invalid duration"), "{e}");
    }

    #[test]
    fn sizes_take_units_and_a_bad_one_names_file_and_key() {
        let f = file("[worker]\nmax_buffered_bytes = \"256MiB\"\nmax_payload_bytes = \"64KiB\"\n");
        let s = load_from(Some(f.path()), Vec::new()).unwrap().settings;
        assert_eq!(s.worker.max_buffered_bytes, 268_435_456);
        assert_eq!(s.worker.max_payload_bytes, 65_536);
        let env = vec![(
            "THROTTLE__WORKER__MAX_PAYLOAD_BYTES".to_owned(),
            "1MB".to_owned(),
        )];
        let s = load_from(None, env).unwrap().settings;
        assert_eq!(s.worker.max_payload_bytes, 1_000_000);

        let f = file("[worker]\nmax_buffered_bytes = \"12 parsecs\"\n");
        let e = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("bad size");
        assert_eq!(e.file, f.path().display().to_string(), "{e}");
        assert_eq!(e.key, "worker.max_buffered_bytes", "{e}");
        assert!(e.problem.contains("unknown unit \"parsecs\""), "{e}");
    }
}
