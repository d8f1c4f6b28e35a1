//! Traces (issue 23, part 6): a job record's W3C `traceparent` goes on to
//! the downstream call (same trace, the call's own span id), a record
//! without one (or with an invalid one) gets a new trace and is not failed
//! for it, and with `[tracing] otlp_endpoint` set each job's span reaches
//! an OTLP/HTTP receiver with its id, seller, wait cause and outcome.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::common::rule;
use crate::common::worker::{
    always_ok, policy, produce_with_headers, Arrival, Bench, Downstream, Running,
};

/// An OTLP/HTTP receiver on loopback: every span of every request to
/// `POST /v1/traces`, decoded from protobuf.
struct Receiver {
    /// The base URL, as an operator writes `tracing.otlp_endpoint`.
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    /// `service.name` of each request's resources.
    services: Arc<Mutex<Vec<String>>>,
}

#[derive(Clone)]
struct ReceiverState {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

async fn traces(State(s): State<ReceiverState>, body: Bytes) -> StatusCode {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    for rs in req.resource_spans {
        if let Some(r) = &rs.resource {
            if let Some(name) = attr(&r.attributes, "service.name") {
                s.services.lock().unwrap().push(name);
            }
        }
        for ss in rs.scope_spans {
            s.spans.lock().unwrap().extend(ss.spans);
        }
    }
    StatusCode::OK
}

impl Receiver {
    async fn start() -> Receiver {
        let state = ReceiverState {
            spans: Arc::default(),
            services: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            endpoint: format!("http://{addr}"),
            spans: state.spans,
            services: state.services,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// An attribute's value as text (strings as they are, integers in decimal).
fn attr(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    let v = attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `traceparent` split into (trace id, parent id, flags), checked the way
/// the spec asks: version 00, lowercase hex, ids not all zero.
fn parse_traceparent(h: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = h.split('-').collect();
    let hex_of = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match parts[..] {
        ["00", t, p, f]
            if hex_of(t, 32)
                && hex_of(p, 16)
                && hex_of(f, 2)
                && t.bytes().any(|b| b != b'0')
                && p.bytes().any(|b| b != b'0') =>
        {
            Some((t.to_owned(), p.to_owned(), f.to_owned()))
        }
        _ => None,
    }
}

/// The spans named `job` of job `id`.
fn job_spans<'a>(spans: &'a [Span], id: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|x| x.name == "job" && attr(&x.attributes, "job.id").as_deref() == Some(id))
        .collect()
}

fn job_value(job_id: &str, seller: &str) -> Vec<u8> {
    serde_json::json!({"job_id": job_id, "seller_id": seller, "payload": {"sku": job_id}})
        .to_string()
        .into_bytes()
}

fn random_hex(n: usize) -> String {
    (0..n / 2)
        .map(|_| format!("{:02x}", rand::random::<u8>() | 1))
        .collect()
}

fn arrival<'a>(arrivals: &'a [Arrival], job_id: &str) -> &'a Arrival {
    arrivals
        .iter()
        .find(|a| a.job_id == job_id)
        .unwrap_or_else(|| panic!("{job_id} never reached the downstream"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_spans_carry_job_seller_wait_cause_and_outcome_and_the_downstream_joins_the_trace() {
    let bench = Bench::new("traces", 1);
    let receiver = Receiver::start().await;
    // `-dl` is refused (400): dead-lettered at once.
    let down = Downstream::start(Arc::new(|a: &Arrival, _| {
        if a.job_id.ends_with("-dl") {
            (StatusCode::BAD_REQUEST, None)
        } else {
            (StatusCode::OK, None)
        }
    }))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.tracing.otlp_endpoint = receiver.endpoint.clone();
    settings.tracing.service_name = "traces-test".to_owned();
    // A wait of 1 s is held in memory, one of 3 s goes round the retry topic.
    settings.worker.max_inline_delay = Duration::from_secs(2);
    let run = format!("{:08x}", rand::random::<u32>());
    let (a, b, c) = (
        format!("tr-{run}-a"),
        format!("tr-{run}-b"),
        format!("tr-{run}-c"),
    );
    // One unit a second, bursts of 3; each seller's jobs are on one
    // partition, so its second job waits for its first.
    // (job id, seller, cost, trace id, parent id on the record)
    let jobs: Vec<(String, String, u64, String, String)> = [
        (format!("{run}-a1"), &a, 3),
        // Waits ~1 s for its unit, in memory: cause `limit`.
        (format!("{run}-a2"), &a, 1),
        (format!("{run}-b1"), &b, 3),
        // Waits ~3 s: to the retry topic, then back and done.
        (format!("{run}-b2"), &b, 3),
        (format!("{run}-dl"), &c, 1),
    ]
    .into_iter()
    .map(|(id, s, cost)| (id, s.clone(), cost, random_hex(32), random_hex(16)))
    .collect();
    for (id, s, cost, trace, parent) in &jobs {
        let tp = format!("00-{trace}-{parent}-01");
        let headers = [("traceparent", tp), ("tracestate", "vendor=x1".to_owned())];
        let value = serde_json::json!({"job_id": id, "seller_id": s, "cost": cost, "payload": {}});
        produce_with_headers(
            &bench.bootstrap(),
            &bench.topics.jobs,
            0,
            value.to_string().as_bytes(),
            &headers,
        )
        .await;
    }
    let w = Running::start(settings, policy(vec![rule("gcra", 1, "1s", Some(3))]));
    down.wait_for("every job called", Duration::from_secs(30), |a| {
        let ids: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
        jobs.iter().all(|(id, ..)| ids.contains(id.as_str()))
    })
    .await;
    bench.wait_dead_letters(1, Duration::from_secs(10));
    // Stopping exports the spans still queued.
    w.stop().await;

    let arrivals = down.arrivals();
    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    for (id, s, _, trace, parent) in &jobs {
        let a = arrival(&arrivals, id);
        let (sent_trace, sent_parent, flags) = parse_traceparent(&a.traceparent)
            .unwrap_or_else(|| panic!("{id}: downstream got traceparent {:?}", a.traceparent));
        assert_eq!(
            &sent_trace, trace,
            "{id}: the downstream call is in the record's trace"
        );
        assert_ne!(
            &sent_parent, parent,
            "{id}: the call has a span id of its own"
        );
        assert_eq!(flags, "01", "{id}: sampled, as the record said");
        assert_eq!(a.tracestate, "vendor=x1", "{id}: tracestate carried on");

        let call = spans
            .iter()
            .find(|x| hex(&x.span_id) == sent_parent)
            .unwrap_or_else(|| {
                panic!("{id}: no span with the call's id {sent_parent} among {names:?}")
            });
        assert_eq!(call.name, "downstream call", "{id}");
        let mine = job_spans(&spans, id);
        assert!(!mine.is_empty(), "{id}: no job span among {names:?}");
        let job = mine
            .iter()
            .find(|j| j.span_id == call.parent_span_id)
            .unwrap_or_else(|| panic!("{id}: the call's parent is not the job's span"));
        for j in &mine {
            // Every span of the job, before and after a retry-topic round
            // trip, is a child of the record's span.
            assert_eq!(
                hex(&j.trace_id),
                *trace,
                "{id}: job span in the record's trace"
            );
            assert_eq!(
                hex(&j.parent_span_id),
                *parent,
                "{id}: child of the record's span"
            );
            assert_eq!(
                attr(&j.attributes, "seller").as_deref(),
                Some(s.as_str()),
                "{id}"
            );
            let waited: Vec<Option<String>> = j
                .events
                .iter()
                .filter(|e| e.name == "waited")
                .map(|e| attr(&e.attributes, "wait.cause"))
                .collect();
            assert_eq!(waited.len(), 1, "{id}: one wait per span: {:?}", j.events);
            assert_eq!(
                attr(&j.attributes, "wait.cause"),
                waited[0],
                "{id}: the span's wait cause is its (only) wait's"
            );
        }
        let expected = if id.ends_with("-dl") {
            "dead_lettered"
        } else {
            "done"
        };
        assert_eq!(
            attr(&job.attributes, "job.outcome").as_deref(),
            Some(expected),
            "{id}: {:?}",
            job.attributes
        );
    }
    let only = |suffix: &str| {
        let mine = job_spans(&spans, &format!("{run}-{suffix}"));
        assert_eq!(mine.len(), 1, "{suffix}: one span: {mine:?}");
        mine[0].clone()
    };
    let dl_kind = only("dl")
        .events
        .iter()
        .find(|e| e.name == "dead_lettered")
        .and_then(|e| attr(&e.attributes, "dead_letter.kind"));
    assert_eq!(dl_kind.as_deref(), Some("downstream_rejected"));
    // `-a2` was refused by the limiter after `-a1` took the burst, and
    // waited in memory for its unit.
    let a2 = only("a2");
    assert_eq!(
        attr(&a2.attributes, "wait.cause").as_deref(),
        Some("limit"),
        "events of -a2: {:?}",
        a2.events
    );
    let waited_ms: u64 = attr(&a2.attributes, "wait.ms").unwrap().parse().unwrap();
    assert!(
        waited_ms >= 500,
        "-a2 waited {waited_ms} ms for a unit at 1/s"
    );
    // `-b2` went round the retry topic for its limit, and came back in its
    // trace (the retry copy kept the traceparent): two spans.
    let b2 = job_spans(&spans, &format!("{run}-b2"));
    let outcomes: Vec<Option<String>> = b2
        .iter()
        .map(|j| attr(&j.attributes, "job.outcome"))
        .collect();
    assert_eq!(b2.len(), 2, "-b2: {outcomes:?}");
    let deferred = b2
        .iter()
        .find(|j| attr(&j.attributes, "job.outcome").as_deref() == Some("retry_topic"))
        .unwrap_or_else(|| panic!("-b2 never went to the retry topic: {outcomes:?}"));
    assert_eq!(
        attr(&deferred.attributes, "wait.cause").as_deref(),
        Some("limit"),
        "events of -b2's first span: {:?}",
        deferred.events
    );
    assert!(
        receiver
            .services
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "traces-test"),
        "service.name from tracing.service_name"
    );
    // The dead letter keeps the record's own trace headers.
    let dlq = bench.dead_letters(1, Duration::ZERO);
    let (_, _, _, trace, parent) = &jobs[4];
    assert_eq!(
        dlq[0].1.get("traceparent").map(String::as_str),
        Some(format!("00-{trace}-{parent}-01").as_str()),
        "dead letter headers: {:?}",
        dlq[0].1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_without_a_valid_traceparent_gets_a_new_trace_and_is_not_failed() {
    let bench = Bench::new("newtrace", 1);
    let down = Downstream::start(always_ok()).await;
    let settings = bench.settings(&down.url);
    let run = format!("{:08x}", rand::random::<u32>());
    let seller = format!("nt-{run}");
    let zero = format!("00-{}-{}-01", "0".repeat(32), random_hex(16));
    // (row, job id, traceparent on the record, if any)
    let rows: Vec<(u32, String, Option<String>)> = vec![
        (1, format!("{run}-none"), None),
        (
            2,
            format!("{run}-garbage"),
            Some("not a traceparent".to_owned()),
        ),
        (3, format!("{run}-zero"), Some(zero.clone())),
        (
            4,
            format!("{run}-upper"),
            Some(format!("00-{}-{}-01", "AB".repeat(16), random_hex(16))),
        ),
    ];
    for (_, id, tp) in &rows {
        let headers: Vec<(&str, String)> = tp
            .iter()
            .map(|t| ("traceparent", t.clone()))
            .chain([("tracestate", "vendor=dropped".to_owned())])
            .collect();
        produce_with_headers(
            &bench.bootstrap(),
            &bench.topics.jobs,
            0,
            &job_value(id, &seller),
            &headers,
        )
        .await;
    }
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("every job called", Duration::from_secs(30), |a| {
        let ids: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
        rows.iter().all(|(_, id, _)| ids.contains(id.as_str()))
    })
    .await;
    w.stop().await;
    let arrivals = down.arrivals();
    let mut traces = HashSet::new();
    for (row, id, given) in &rows {
        let a = arrival(&arrivals, id);
        let (trace, _, _) = parse_traceparent(&a.traceparent).unwrap_or_else(|| {
            panic!(
                "row {row}: {given:?} became {:?}, not a valid traceparent",
                a.traceparent
            )
        });
        if let Some(given) = given {
            assert!(
                !given.contains(&trace),
                "row {row}: {given} was not replaced"
            );
        }
        assert_eq!(
            a.tracestate, "",
            "row {row}: no tracestate without a valid parent"
        );
        assert!(traces.insert(trace), "row {row}: a trace of its own");
        assert_eq!(
            arrivals.iter().filter(|x| x.job_id == *id).count(),
            1,
            "row {row}: called once, done (an invalid header is not a failure)"
        );
    }
    assert!(
        bench.dead_letters(0, Duration::ZERO).is_empty(),
        "nothing dead-lettered"
    );
}
