//! `[tracing]` and its checks; `Debug` hides the endpoint's credentials.

use std::fmt;

use serde::Deserialize;

use super::error::{self, Invalid};
use super::redact::redact_url;

/// `[tracing]`: job spans exported through OTLP. The W3C trace context of
/// a job record goes on to the downstream whatever is set here.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingSettings {
    /// OTLP/HTTP collector (protobuf), e.g. `http://otel-collector:4318`;
    /// an endpoint with no path gets `/v1/traces`. Empty (the default): no
    /// spans are exported. Give credentials in `OTEL_EXPORTER_OTLP_HEADERS`,
    /// not in the URL (the exporter's errors may quote it).
    pub otlp_endpoint: String,
    /// Share of new traces (jobs whose record has no valid traceparent)
    /// that are exported, 0 to 1; a job with a traceparent follows its
    /// sampled flag. Default 1.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans. Default `throttle-worker`.
    pub service_name: String,
}

/// The endpoint with any credentials hidden.
impl fmt::Debug for TracingSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracingSettings")
            .field("otlp_endpoint", &redact_url(&self.otlp_endpoint))
            .field("sample_ratio", &self.sample_ratio)
            .field("service_name", &self.service_name)
            .finish()
    }
}

impl TracingSettings {
    /// Checks that serde's types cannot express.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty() {
            let host = endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
                return Err(Invalid::new(
                    "tracing.otlp_endpoint",
                    TracingProblem::OtlpEndpoint,
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(Invalid::new(
                "tracing.sample_ratio",
                TracingProblem::SampleRatio,
            ));
        }
        error::nonempty(&[("tracing.service_name", &self.service_name)])
    }
}

/// What is wrong with a value of `[tracing]`.
#[derive(Debug, thiserror::Error)]
pub(super) enum TracingProblem {
    #[error("must be an http:// or https:// URL such as http://otel-collector:4318, or empty")]
    OtlpEndpoint,
    #[error("must be between 0 and 1")]
    SampleRatio,
}
