//! Secrets kept out of logs: the settings' `Debug` shows librdkafka's
//! secret properties as `***` and URLs without their password, because
//! settings get logged at startup and pasted into tickets.

use std::collections::BTreeMap;

/// librdkafka properties whose values are secrets: shown as `***`.
pub fn is_secret_property(key: &str) -> bool {
    [
        "password",
        "secret",
        "sasl.jaas",
        "oauthbearer.config",
        "key.pem",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// A property table as `Debug` shows it: secret values as `***`.
pub(super) fn redacted(map: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    map.iter()
        .map(|(k, v)| {
            let shown = if is_secret_property(k) {
                "***"
            } else {
                v.as_str()
            };
            (k.as_str(), shown)
        })
        .collect()
}

/// `redis://user:secret@host` → `redis://user:***@host`, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            if creds.contains(':') {
                format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
            } else {
                format!("{}***{}", &url[..scheme + 3], &url[at..])
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_password_is_redacted() {
        assert_eq!(redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    }
}
