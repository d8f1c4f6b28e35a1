//! A plain `GET` for the tools ([`get_text`]): the demo's scrapes, here
//! because this module owns the HTTP client. Nothing of the worker's path
//! uses it, so it is built with the `dev-tools` feature only, like the
//! tools themselves.

use std::time::Duration;

use super::error_chain;

/// Why [`get_text`] got no text.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {url}: {reason}")]
    Request { url: String, reason: String },
    #[error("GET {url}: answered {status}")]
    Status { url: String, status: u16 },
}

/// `GET url` and its body as text, within `timeout`: the demo's scrape of
/// each replica's `/metrics` and the stub's `/stats` (this module owns the
/// HTTP client). Anything but a 2xx is an error.
pub async fn get_text(url: &str, timeout: Duration) -> Result<String, FetchError> {
    // One client for every call: a scrape a second per replica should
    // reuse its connections, not build a TLS context each time.
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(reqwest::Client::new);
    let fail = |e: reqwest::Error| FetchError::Request {
        url: url.to_owned(),
        reason: error_chain(&e),
    };
    let response = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(fail)?;
    let status = response.status();
    if !status.is_success() {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    response.text().await.map_err(fail)
}
