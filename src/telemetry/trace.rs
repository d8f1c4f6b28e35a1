//! Traces: the W3C trace context of a job carried from its Kafka record to
//! the downstream call, and (when `[tracing] otlp_endpoint` is set) one
//! span per job exported through OTLP/HTTP. The only module that imports
//! the `opentelemetry*` crates.
//!
//! A job's [`JobTrace`] is made when the worker takes its record: it
//! continues the record's `traceparent` (or starts a new trace when there
//! is none, or an invalid one). Each downstream call gets a `traceparent`
//! of the same trace with a new parent id: the id of the call's span,
//! a child of the job's span. With no exporter the ids are still made
//! (at random), so the downstream can always join the trace.
//!
//! The job span records: `received` (span start), a `waited` event with
//! its cause before each call (and before a retry-topic write), the call as
//! a child span `downstream call`, and
//! the outcome (`job.outcome`: `done`, `dead_lettered`, `retry_topic`, or
//! `dropped` for a job let go on a revoke or at shutdown).
//!
//! Wait causes come from the typed events that hold a seller back
//! ([`note_seller_wait`]): `limit`, `downstream_429`,
//! `limiter_unavailable`, `capacity`; a job's own `backoff` after a
//! retryable failure; `none` when nothing held it back (only the limiter's
//! round trip and the seller's earlier jobs of its partition).
//!
//! The spans are built with the OpenTelemetry API directly rather than
//! through `tracing` spans and `tracing-opentelemetry`: a job's span lives
//! across many tasks and is ended by the job's fate, not by a scope; the
//! log subscriber is installed before the config is read; and `RUST_LOG`
//! must not decide which jobs are traced.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Span, Tracer};

use super::traceparent::{to_hex, TraceHeaders};

/// How long one OTLP export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for the last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Sellers whose last wait is remembered; beyond it, waits that are over
/// are forgotten (a wait cause is a hint, not state the worker needs).
const MAX_NOTED_SELLERS: usize = 10_000;

/// Why [`Export::start`] failed; the messages name the key.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The endpoint is not repeated: it may carry credentials.
    #[error("cannot build the OTLP exporter: {reason}")]
    Exporter { reason: String },
}

/// The tracer jobs use while an [`Export`] runs, with the number of the
/// export that installed it.
static TRACER: RwLock<Option<(u64, Tracer)>> = RwLock::new(None);
static EXPORTING: AtomicBool = AtomicBool::new(false);
static EXPORTS: AtomicU64 = AtomicU64::new(0);

fn tracer() -> Option<Tracer> {
    if !EXPORTING.load(Ordering::Acquire) {
        return None;
    }
    let t = TRACER.read().unwrap_or_else(|p| p.into_inner());
    t.as_ref().map(|(_, t)| t.clone())
}

/// The OTLP export of job spans, for as long as it is held: one per
/// process (a second one replaces the first, as two workers in one test
/// process would). [`Export::shutdown`] exports what is left.
pub struct Export {
    id: u64,
    provider: SdkTracerProvider,
}

impl Export {
    /// Starts exporting to `endpoint` (OTLP over HTTP, protobuf). An
    /// endpoint with no path gets the OTLP traces path `/v1/traces`, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` does. New traces are sampled at
    /// `sample_ratio`; a job whose record carries a traceparent follows its
    /// sampled flag. `Ok(None)` when `endpoint` is empty.
    pub fn start(
        endpoint: &str,
        sample_ratio: f64,
        service_name: &str,
        instance: &str,
    ) -> Result<Option<Export>, TraceError> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() {
            return Ok(None);
        }
        let url = traces_url(endpoint);
        // Not logged here: the caller logs it with any credentials hidden.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TraceError::Exporter {
                reason: e.to_string(),
            })?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service_name.to_owned())
            .with_attribute(KeyValue::new("service.instance.id", instance.to_owned()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let id = EXPORTS.fetch_add(1, Ordering::AcqRel) + 1;
        let tracer = provider.tracer("throttle-worker");
        *TRACER.write().unwrap_or_else(|p| p.into_inner()) = Some((id, tracer));
        EXPORTING.store(true, Ordering::Release);
        Ok(Some(Export { id, provider }))
    }

    /// Stops the export (unless a later one replaced it) and exports the
    /// spans still queued, waiting at most a few seconds. Blocks: call it
    /// off the async threads.
    pub fn shutdown(self) {
        {
            let mut t = TRACER.write().unwrap_or_else(|p| p.into_inner());
            if t.as_ref().is_some_and(|(id, _)| *id == self.id) {
                *t = None;
                EXPORTING.store(false, Ordering::Release);
            }
        }
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "the last job spans may not have been exported");
        }
    }
}

/// `endpoint`, with `/v1/traces` when it names no path.
fn traces_url(endpoint: &str) -> String {
    let after_scheme = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    match after_scheme.find('/') {
        Some(i) if after_scheme[i..] != *"/" => endpoint.to_owned(),
        _ => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
    }
}

// ---- what held a seller back ----

/// A seller's latest wait.
#[derive(Debug, Clone, Copy)]
struct Note {
    cause: &'static str,
    at: Instant,
    /// When it ends, if known (a capacity wait ends with a free slot).
    until: Option<Instant>,
}

static WAITS: Mutex<Option<HashMap<Box<str>, Note>>> = Mutex::new(None);

fn waits() -> MutexGuard<'static, Option<HashMap<Box<str>, Note>>> {
    // Plain data: a panic elsewhere leaves at worst a stale note.
    WAITS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes that `seller`'s jobs wait, and why, for the spans of the jobs
/// waiting now. Called by the typed events that hold a seller back; does
/// nothing unless spans are exported.
pub fn note_seller_wait(seller: &str, cause: &'static str, wait: Option<Duration>) {
    if !EXPORTING.load(Ordering::Acquire) {
        return;
    }
    let now = Instant::now();
    let note = Note {
        cause,
        at: now,
        until: wait.and_then(|w| now.checked_add(w)),
    };
    let mut w = waits();
    let map = w.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_NOTED_SELLERS && !map.contains_key(seller) {
        map.retain(|_, n| n.until.is_some_and(|u| u > now));
        if map.len() >= MAX_NOTED_SELLERS {
            map.clear();
        }
    }
    map.insert(seller.into(), note);
}

fn seller_note(seller: &str) -> Option<Note> {
    if !EXPORTING.load(Ordering::Acquire) {
        return None;
    }
    waits().as_ref().and_then(|m| m.get(seller).copied())
}

/// The `cause` of a refusal's `by` label (`rule0`, …, `downstream_429`,
/// `unavailable`).
pub fn cause_of_refusal(by: &str) -> &'static str {
    match by {
        "downstream_429" => "downstream_429",
        "unavailable" => "limiter_unavailable",
        "max_in_flight" => "capacity",
        _ => "limit",
    }
}

// ---- one job's trace ----

/// A job's trace context, and its span when spans are exported. Made by
/// [`JobTrace::start`] when the worker takes the record; the default (a
/// job parsed outside the worker) starts a new trace at each call.
#[derive(Default)]
pub struct JobTrace(Option<Box<Mutex<Inner>>>);

impl std::fmt::Debug for JobTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("JobTrace(none)"),
            Some(inner) => {
                let i = lock(inner);
                write!(f, "JobTrace({}-{})", i.trace_id, i.span_id)
            }
        }
    }
}

struct Inner {
    trace_id: TraceId,
    /// The job span's id: the parent of each call's span.
    span_id: SpanId,
    flags: TraceFlags,
    /// The record's tracestate (checked printable, bounded), carried on.
    state: Option<String>,
    /// Present while spans are exported and this job's trace is sampled.
    span: Option<Span>,
    /// The job's seller, to look up its waits; only with a span.
    seller: Option<Box<str>>,
    tracer: Option<Tracer>,
    /// From when the current wait counts: the record's receipt, then the
    /// end of each call.
    since: Instant,
    /// The seller's wait in force when the job arrived, if any.
    at_receipt: Option<&'static str>,
    /// The job's own reason to wait after its last call (a backoff, a 429).
    own: Option<&'static str>,
    /// The longest wait so far and its cause, and all waits summed.
    longest: Option<(Duration, &'static str)>,
    waited: Duration,
    /// `job.outcome` once known.
    outcome: Option<&'static str>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Plain data and a span: a panic elsewhere cannot corrupt either.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_trace_id() -> TraceId {
    loop {
        let id: u128 = rand::random();
        if id != 0 {
            return TraceId::from_bytes(id.to_be_bytes());
        }
    }
}

fn random_span_id() -> SpanId {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return SpanId::from_bytes(id.to_be_bytes());
        }
    }
}

impl JobTrace {
    /// Continues the record's trace (or starts one) for the job `job_id`
    /// of `seller`. An invalid traceparent is replaced by a new trace (it
    /// never fails the job) and its kind returned beside it, for the caller
    /// to count: this module emits no event, since the events note a
    /// seller's waits here (an import each way was a cycle).
    pub fn start(
        headers: &TraceHeaders,
        job_id: &str,
        seller: &str,
        cost: u64,
    ) -> (JobTrace, Option<&'static str>) {
        let (parent, invalid) = match headers.parent() {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e.kind())),
        };
        let remote = parent.as_ref().map(|(tp, state)| {
            SpanContext::new(
                TraceId::from_bytes(tp.trace_id),
                SpanId::from_bytes(tp.parent_id),
                TraceFlags::new(tp.flags & 1),
                true,
                state
                    .as_deref()
                    .and_then(|s| s.parse::<TraceState>().ok())
                    .unwrap_or_default(),
            )
        });
        let state = parent.and_then(|(_, s)| s);
        let now = Instant::now();
        let at_receipt = seller_note(seller)
            .filter(|n| n.until.is_some_and(|u| u > now))
            .map(|n| n.cause);
        let tracer = tracer();
        let span = tracer.as_ref().map(|t| {
            let cx = remote.clone().map_or_else(Context::new, |sc| {
                Context::new().with_remote_span_context(sc)
            });
            t.span_builder("job")
                .with_kind(SpanKind::Consumer)
                .with_attributes([
                    KeyValue::new("job.id", job_id.to_owned()),
                    KeyValue::new("seller", seller.to_owned()),
                    KeyValue::new("job.cost", i64::try_from(cost).unwrap_or(i64::MAX)),
                ])
                .start_with_context(t, &cx)
        });
        // The exported span's ids when there is one (its trace is the
        // record's, or the SDK's new one), else ids of our own.
        let made = span
            .as_ref()
            .map(|s| s.span_context().clone())
            .filter(SpanContext::is_valid);
        let (trace_id, span_id, flags) = match (&made, &remote) {
            (Some(sc), _) => (sc.trace_id(), sc.span_id(), sc.trace_flags()),
            (None, Some(r)) => (r.trace_id(), random_span_id(), r.trace_flags()),
            (None, None) => (random_trace_id(), random_span_id(), TraceFlags::default()),
        };
        // A span that is not sampled records nothing: drop it now.
        let span = span.filter(|s| s.is_recording());
        let mut inner = Inner {
            trace_id,
            span_id,
            flags,
            state,
            tracer: span.as_ref().and(tracer),
            seller: span.as_ref().map(|_| seller.into()),
            span,
            since: now,
            at_receipt,
            own: None,
            longest: None,
            waited: Duration::ZERO,
            outcome: None,
        };
        if let Some(s) = inner.span.as_mut() {
            s.add_event("received", Vec::new());
        }
        (JobTrace(Some(Box::new(Mutex::new(inner)))), invalid)
    }

    /// The trace id, as 32 lowercase hex digits; `None` for a job parsed
    /// outside the worker (each of its calls starts a new trace).
    pub fn trace_id(&self) -> Option<String> {
        self.0.as_ref().map(|i| lock(i).trace_id.to_string())
    }

    /// A downstream call of the job is about to go out: records how long
    /// the job waited for it and why, starts the call's span, and returns
    /// the headers to send.
    pub fn call(&self) -> Call<'_> {
        let Some(inner) = &self.0 else {
            return Call {
                traceparent: header(random_trace_id(), random_span_id(), TraceFlags::default()),
                tracestate: None,
                span: None,
                job: self,
            };
        };
        let mut guard = lock(inner);
        let i = &mut *guard;
        i.wait_ends();
        let mut call_span = None;
        if let (Some(span), Some(tracer)) = (i.span.as_mut(), i.tracer.as_ref()) {
            let cx = Context::new().with_remote_span_context(span.span_context().clone());
            call_span = Some(
                tracer
                    .span_builder("downstream call")
                    .with_kind(SpanKind::Client)
                    .start_with_context(tracer, &cx),
            );
        }
        let call_id = call_span
            .as_ref()
            .map(|s| s.span_context().span_id())
            .filter(|id| *id != SpanId::INVALID)
            .unwrap_or_else(random_span_id);
        Call {
            traceparent: header(i.trace_id, call_id, i.flags),
            tracestate: i.state.clone(),
            span: call_span,
            job: self,
        }
    }

    /// The job's fate, decided by the worker: `dead_lettered` (with the
    /// dead-letter kind) or `retry_topic` (with the tier's topic). Ends
    /// the span.
    pub fn finish(&self, outcome: &'static str, detail: &str) {
        let Some(inner) = &self.0 else { return };
        let mut i = lock(inner);
        // A job sent round the retry topic is there for its wait; one that
        // never got to a call (a cost over a rule's capacity) waited too.
        if outcome == "retry_topic" || i.longest.is_none() {
            i.wait_ends();
        }
        i.outcome = Some(outcome);
        if let Some(span) = i.span.as_mut() {
            let key = if outcome == "dead_lettered" {
                "dead_letter.kind"
            } else {
                "retry.topic"
            };
            span.add_event(outcome, vec![KeyValue::new(key, detail.to_owned())]);
        }
        i.end();
    }
}

impl Inner {
    /// The job's current wait ends now: event `waited` with its length and
    /// cause (the seller's latest wait since it began, else the job's own,
    /// else the seller's wait in force when the job arrived, else `none`).
    fn wait_ends(&mut self) {
        let now = Instant::now();
        let waited = now.saturating_duration_since(self.since);
        let since = self.since;
        let note = self
            .seller
            .as_deref()
            .and_then(seller_note)
            .filter(|n| n.at >= since);
        let cause = note
            .map(|n| n.cause)
            .or(self.own.take())
            .or(self.at_receipt.take())
            .unwrap_or("none");
        self.since = now;
        self.waited += waited;
        if self.longest.is_none_or(|(d, _)| waited > d) {
            self.longest = Some((waited, cause));
        }
        if let Some(span) = self.span.as_mut() {
            span.add_event(
                "waited",
                vec![
                    KeyValue::new("wait.cause", cause),
                    KeyValue::new("wait.ms", millis(waited)),
                ],
            );
        }
    }

    /// Writes the summary attributes and ends the span (once).
    fn end(&mut self) {
        let Some(mut span) = self.span.take() else {
            return;
        };
        let outcome = self.outcome.unwrap_or("dropped");
        span.set_attribute(KeyValue::new("job.outcome", outcome));
        if let Some((_, cause)) = self.longest {
            span.set_attribute(KeyValue::new("wait.cause", cause));
        }
        span.set_attribute(KeyValue::new("wait.ms", millis(self.waited)));
        span.end();
    }
}

impl Drop for Inner {
    /// A job dropped without a fate from [`JobTrace::finish`]: done (set by
    /// its last call), or let go on a revoke or at shutdown.
    fn drop(&mut self) {
        self.end();
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn header(trace_id: TraceId, span_id: SpanId, flags: TraceFlags) -> String {
    format!(
        "00-{}-{}-{:02x}",
        to_hex(&trace_id.to_bytes()),
        to_hex(&span_id.to_bytes()),
        flags.to_u8() & 1
    )
}

/// One downstream call of a job: the headers to send, and its span.
pub struct Call<'a> {
    /// The `traceparent` to send: the job's trace, the call's span id.
    pub traceparent: String,
    /// The record's `tracestate`, if it had a valid one.
    pub tracestate: Option<String>,
    span: Option<Span>,
    job: &'a JobTrace,
}

impl Call<'_> {
    /// The call is over: `class` is the answer's class (`2xx`, `429`,
    /// `4xx`, `5xx`, `other`, `timeout`, `error`). A 2xx makes the job
    /// `done`; a 429 or a retryable failure is what the job waits for next.
    pub fn end(mut self, class: &'static str) {
        if let Some(span) = self.span.as_mut() {
            span.set_attribute(KeyValue::new("http.response.class", class));
            span.end();
        }
        let Some(inner) = &self.job.0 else { return };
        let mut i = lock(inner);
        i.since = Instant::now();
        match class {
            "2xx" => i.outcome = Some("done"),
            "429" => i.own = Some("downstream_429"),
            "5xx" | "timeout" | "error" => i.own = Some("backoff"),
            _ => {}
        }
        if let Some(span) = i.span.as_mut() {
            span.add_event("called", vec![KeyValue::new("http.response.class", class)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::traceparent::TraceParent;

    #[test]
    fn endpoints_without_a_path_get_the_traces_path() {
        for (row, given, url) in [
            (1, "http://c:4318", "http://c:4318/v1/traces"),
            (2, "http://c:4318/", "http://c:4318/v1/traces"),
            (3, "https://c/otlp/v1/traces", "https://c/otlp/v1/traces"),
        ] {
            assert_eq!(traces_url(given), url, "row {row}");
        }
    }

    fn headers(tp: &str) -> TraceHeaders {
        TraceHeaders {
            traceparent: Some(tp.as_bytes().to_vec()),
            tracestate: Some(b"congo=t61rcWkgMzE".to_vec()),
        }
    }

    #[test]
    fn a_call_continues_the_records_trace_with_a_new_parent_id() {
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, _) = JobTrace::start(&headers(given), "j1", "s1", 1);
        let call = t.call();
        let sent = TraceParent::parse(call.traceparent.as_bytes()).expect("valid");
        let got = TraceParent::parse(given.as_bytes()).unwrap();
        assert_eq!(sent.trace_id, got.trace_id, "{}", call.traceparent);
        assert_ne!(sent.parent_id, got.parent_id, "{}", call.traceparent);
        assert!(sent.sampled(), "the sampled flag goes on");
        assert_eq!(call.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        let again = t.call();
        assert_ne!(
            again.traceparent, call.traceparent,
            "each call has its own span"
        );
    }

    #[test]
    fn no_or_an_invalid_traceparent_starts_a_new_trace() {
        for (row, h) in [
            (1, TraceHeaders::default()),
            (
                2,
                headers("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            ),
            (3, headers("garbage")),
        ] {
            let (t, _) = JobTrace::start(&h, "j1", "s1", 1);
            let a = t.call();
            let sent = TraceParent::parse(a.traceparent.as_bytes())
                .unwrap_or_else(|e| panic!("row {row}: {e}: {}", a.traceparent));
            assert_eq!(
                a.tracestate, None,
                "row {row}: no tracestate without a parent"
            );
            let (other_job, _) = JobTrace::start(&h, "j2", "s1", 1);
            let b = other_job.call();
            let other = TraceParent::parse(b.traceparent.as_bytes()).unwrap();
            assert_ne!(sent.trace_id, other.trace_id, "row {row}: a new trace each");
            assert_eq!(
                t.trace_id().as_deref(),
                Some(to_hex(&sent.trace_id).as_str()),
                "row {row}"
            );
        }
    }
}
