//! `THROTTLE__…` variables of a container, checked by loading them with
//! the worker's own loader (`config::load_from`): the config structs are
//! `deny_unknown_fields`, so a misspelt key, a bad value or an unknown
//! section fails the way it would fail the container's startup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use throttle_worker::config::{self, Settings};
use throttle_worker::limiter::Policy;

/// Where a container's paths come from on this machine: `(container
/// directory or file, local path)`, e.g. a compose bind mount or a
/// ConfigMap written to a temporary directory.
#[derive(Debug, Clone, Default)]
pub struct Mounts(pub Vec<(String, PathBuf)>);

impl Mounts {
    /// The local file behind a container path, if a mount covers it.
    pub fn local(&self, container_path: &str) -> Option<PathBuf> {
        self.0
            .iter()
            .filter_map(|(target, local)| {
                let target = target.trim_end_matches('/');
                if container_path == target {
                    Some((target.len(), local.clone()))
                } else {
                    container_path
                        .strip_prefix(&format!("{target}/"))
                        .map(|rest| (target.len(), local.join(rest)))
                }
            })
            // The deepest mount wins, as in a container.
            .max_by_key(|(len, _)| *len)
            .map(|(_, p)| p)
    }
}

/// The outcome of one container's environment.
pub struct Checked {
    pub settings: Settings,
    /// The limits file `THROTTLE__LIMITS__FILE` names, mapped to this
    /// machine.
    pub limits_file: Option<PathBuf>,
}

/// Loads `env` (and the `--config` file, a container path) as the
/// container would. `what` names the container in the messages.
pub fn check(
    what: &str,
    env: &BTreeMap<String, String>,
    config_file: Option<&str>,
    mounts: &Mounts,
) -> Result<Checked, String> {
    let mut loaded_env = Vec::new();
    let mut limits_file = None;
    for (k, v) in env {
        if !k.starts_with("THROTTLE__") {
            continue;
        }
        if k.chars().any(|c| c.is_ascii_lowercase()) {
            return Err(format!(
                "{what}: {k}: environment keys are upper case (THROTTLE__SECTION__KEY)"
            ));
        }
        // A path inside the container is read from where it comes from.
        let value = if v.starts_with('/') {
            match mounts.local(v) {
                Some(local) => local.display().to_string(),
                None => {
                    return Err(format!(
                        "{what}: {k}={v}: no volume of the container provides this path"
                    ))
                }
            }
        } else {
            v.clone()
        };
        // Loaded like every other key (the loader reads the file, merged
        // over the config); also kept to check it as a limits file alone.
        if k == "THROTTLE__LIMITS__FILE" {
            limits_file = Some(PathBuf::from(&value));
        }
        loaded_env.push((k.clone(), value));
    }
    let file = match config_file {
        Some(p) => Some(mounts.local(p).ok_or_else(|| {
            format!("{what}: --config {p}: no volume of the container provides this path")
        })?),
        None => None,
    };
    let loaded =
        config::load_from(file.as_deref(), loaded_env).map_err(|e| format!("{what}: {e}"))?;
    Policy::load(&loaded).map_err(|e| format!("{what}: {e}"))?;
    Ok(Checked {
        settings: loaded.settings,
        limits_file,
    })
}

/// A limits file (the `[limits]` tables alone) loads as the worker's limits:
/// it is a valid config file on its own, and its rules pass the policy's
/// validation.
pub fn check_limits_file(what: &str, path: &Path) -> Result<Policy, String> {
    if !path.is_file() {
        return Err(format!(
            "{what}: limits file {}: no such file",
            path.display()
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{what}: {}: {e}", path.display()))?;
    let outside: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('['))
        .filter(|l| !l.trim_start_matches('[').starts_with("limits"))
        .collect();
    if !outside.is_empty() {
        return Err(format!(
            "{what}: {}: a limits file holds [limits] tables only, found {outside:?}",
            path.display()
        ));
    }
    let loaded = config::load_from(Some(path), Vec::new()).map_err(|e| format!("{what}: {e}"))?;
    Policy::load(&loaded).map_err(|e| format!("{what}: {e}"))
}
