//! [`Downstream`]: the reqwest client that posts a job, and the
//! classification of what came back into an [`Answer`].

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use tokio::sync::Semaphore;

use super::{
    error_chain, retry_after, Answer, DownstreamError, RetryAfter, RetryStatuses,
    DEFAULT_MAX_RETRY_AFTER,
};
use crate::job::Job;
use crate::telemetry::events::DownstreamAnswered;
use crate::telemetry::traceparent::{TRACEPARENT, TRACESTATE};

/// How much of an error response's body goes into a fatal reason (which
/// becomes a dead letter's `x-error` header, so it must stay short).
const BODY_EXCERPT_BYTES: usize = 256;

/// A client for the downstream API with a bound on concurrent calls.
#[derive(Debug)]
pub struct Downstream {
    client: reqwest::Client,
    /// Validated at construction: absolute, http or https.
    url: Url,
    timeout: Duration,
    /// Holds `concurrency` permits; one per call in flight. Never closed.
    permits: Semaphore,
    /// Upper bound of every [`RetryAfter::Wait`]; greater than zero.
    max_retry_after: Duration,
    /// `X-Worker-Id`: which replica called, for the downstream's logs.
    worker_id: Option<HeaderValue>,
    /// Statuses worth another attempt (`downstream.retry_statuses`).
    retry: RetryStatuses,
}

impl Downstream {
    /// Validates the settings and builds the client. `timeout` bounds one
    /// whole request (connect, send, response); waiting for a concurrency
    /// permit is not counted.
    pub fn new(
        url: &str,
        timeout: Duration,
        concurrency: usize,
    ) -> Result<Downstream, DownstreamError> {
        let url = parse_url(url)?;
        if concurrency == 0 {
            return Err(DownstreamError::ZeroConcurrency);
        }
        if timeout.is_zero() {
            return Err(DownstreamError::ZeroTimeout);
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            // A 3xx is classified as fatal rather than followed: a POST
            // carrying a job should not silently land somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(concurrency)
            .build()
            .map_err(|e| DownstreamError::Client(error_chain(&e)))?;
        Ok(Downstream {
            client,
            url,
            timeout,
            permits: Semaphore::new(concurrency.min(Semaphore::MAX_PERMITS)),
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            worker_id: None,
            retry: RetryStatuses::default(),
        })
    }

    /// Names this replica in every request (`X-Worker-Id`); an id that is
    /// not a valid header value is left out.
    pub fn with_worker_id(mut self, id: &str) -> Downstream {
        self.worker_id = HeaderValue::from_str(id).ok();
        self
    }

    /// Sets `downstream.retry_statuses`.
    pub fn with_retry_statuses(mut self, retry: RetryStatuses) -> Downstream {
        self.retry = retry;
        self
    }

    /// Sets `downstream.max_retry_after` (default [`DEFAULT_MAX_RETRY_AFTER`]).
    /// Config validation keeps it above zero; a zero here is ignored, since
    /// clamping every 429 to "now" would turn a throttled seller into a
    /// tight loop.
    pub fn with_max_retry_after(mut self, max: Duration) -> Downstream {
        if !max.is_zero() {
            self.max_retry_after = max;
        }
        self
    }

    /// The validated URL every job is posted to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Posts one job and classifies the answer. Waits for a concurrency
    /// permit first.
    pub async fn send(&self, job: &Job) -> Answer {
        self.send_granted(job, None).await
    }

    /// [`Downstream::send`], naming in `X-Granted-At` when the limiter
    /// granted the job (Unix µs on the limiter's clock, Redis' `TIME`: the
    /// decision, or a pacer's go-at for the job's first unit). The
    /// downstream, and the tests, can then compare each call with its
    /// grant instead of with their own clock.
    pub async fn send_granted(&self, job: &Job, granted_at_us: Option<u64>) -> Answer {
        // The semaphore is owned by `self` and never closed, so acquire can
        // only fail if that invariant is broken; report it as retryable
        // rather than panic inside the worker.
        let Ok(_permit) = self.permits.acquire().await else {
            return Answer::Retryable {
                reason: "downstream concurrency limiter is closed".to_owned(),
            };
        };
        let seller = match HeaderValue::from_str(job.seller_id.as_str()) {
            Ok(v) => v,
            Err(_) => return fatal_header("seller_id"),
        };
        let key = match HeaderValue::from_str(&job.job_id) {
            Ok(v) => v,
            Err(_) => return fatal_header("job_id"),
        };
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key)
            .header("X-Seller-Id", seller)
            .header("X-Job-Cost", HeaderValue::from(job.cost));
        if let Some(id) = &self.worker_id {
            request = request.header("X-Worker-Id", id.clone());
        }
        if let Some(at) = granted_at_us {
            request = request.header("X-Granted-At", HeaderValue::from(at));
        }
        // W3C trace context: the job's trace, this call's span as parent.
        let trace = job.trace.call();
        if let Ok(v) = HeaderValue::from_str(&trace.traceparent) {
            request = request.header(TRACEPARENT, v);
        }
        if let Some(v) = trace
            .tracestate
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            request = request.header(TRACESTATE, v);
        }
        let started = std::time::Instant::now();
        let sent = request.body(job.payload.clone()).send().await;
        let (answer, class) = match sent {
            Ok(response) => {
                let class = status_class(response.status());
                (
                    classify_response(response, self.max_retry_after, &self.retry).await,
                    class,
                )
            }
            Err(e) => {
                let class = if e.is_timeout() { "timeout" } else { "error" };
                (self.classify_error(&e), class)
            }
        };
        DownstreamAnswered {
            class,
            took: started.elapsed(),
        }
        .emit();
        trace.end(class);
        answer
    }

    fn classify_error(&self, e: &reqwest::Error) -> Answer {
        if e.is_builder() {
            return Answer::Fatal {
                status: None,
                reason: format!("could not build the downstream request: {}", error_chain(e)),
            };
        }
        let reason = if e.is_timeout() {
            format!("downstream timed out after {:?}", self.timeout)
        } else if e.is_connect() {
            format!("could not connect to the downstream: {}", error_chain(e))
        } else {
            format!("downstream request failed: {}", error_chain(e))
        };
        Answer::Unreachable { reason }
    }
}

/// The `class` label of a downstream answer.
fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        429 => "429",
        200..=299 => "2xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

fn fatal_header(field: &str) -> Answer {
    // Job::parse rejects control characters, so this only fires for ids
    // built some other way.
    Answer::Fatal {
        status: None,
        reason: format!("{field} cannot be sent as an HTTP header value"),
    }
}

fn parse_url(url: &str) -> Result<Url, DownstreamError> {
    let parsed = Url::parse(url).map_err(|e| DownstreamError::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => {
            return Err(DownstreamError::UnsupportedScheme {
                url: url.to_owned(),
                scheme: other.to_owned(),
            })
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(DownstreamError::InvalidUrl {
            url: url.to_owned(),
            reason: "no host".to_owned(),
        });
    }
    Ok(parsed)
}

async fn classify_response(
    mut response: reqwest::Response,
    max_retry_after: Duration,
    retry: &RetryStatuses,
) -> Answer {
    let status = response.status();
    if status.is_success() {
        return Answer::Done;
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        // Non-ASCII values cannot be read and count as absent.
        let values = response
            .headers()
            .get_all(RETRY_AFTER)
            .iter()
            .filter_map(|v| v.to_str().ok());
        return Answer::Throttled(retry_after(values, SystemTime::now(), max_retry_after));
    }
    let excerpt = body_excerpt(&mut response).await;
    let reason = match excerpt {
        Some(body) => format!("downstream answered {status}: {body}"),
        None => format!("downstream answered {status}"),
    };
    if retry.contains(status.as_u16()) {
        let values = response
            .headers()
            .get_all(RETRY_AFTER)
            .iter()
            .filter_map(|v| v.to_str().ok());
        match retry_after(values, SystemTime::now(), max_retry_after) {
            RetryAfter::Wait(wait) if !wait.is_zero() => Answer::Unavailable {
                retry_after: wait,
                reason,
            },
            _ if matches!(status.as_u16(), 502..=504) => Answer::Unreachable { reason },
            _ => Answer::Retryable { reason },
        }
    } else {
        Answer::Fatal {
            status: Some(status.as_u16()),
            reason,
        }
    }
}

/// The first bytes of the body as one line of text, for the reason string.
/// A body that cannot be read is simply left out.
async fn body_excerpt(response: &mut reqwest::Response) -> Option<String> {
    let mut bytes = Vec::new();
    while bytes.len() < BODY_EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(BODY_EXCERPT_BYTES);
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
