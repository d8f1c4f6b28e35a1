//! `throttle-worker produce`: a load generator for demos, benchmarks and
//! rehearsals. Jobs of many sellers with a Zipf skew (a few sellers send
//! most jobs, as in a real marketplace), a share of malformed records (to
//! exercise the dead-letter path), a chosen payload size and a paced rate,
//! with a progress bar on a terminal.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::kafka::{RecordSink, SinkError};

/// What to generate.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub jobs: u64,
    pub sellers: u64,
    /// Zipf exponent: 0 is uniform, 1 the classic skew (seller k sends in
    /// proportion to 1/k).
    pub skew: f64,
    /// Jobs per second; 0 is as fast as the broker takes them.
    pub rate: f64,
    /// Share of records that are not valid jobs, 0.0..=1.0.
    pub malformed: f64,
    /// Bytes of the payload's filler field.
    pub payload_bytes: usize,
    /// Prefix of job ids, so runs do not collide.
    pub run_id: String,
}

/// Sellers by Zipf weight: seller `k` (1-based) has weight `1 / k^skew`.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: u64, skew: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n as usize);
        for k in 1..=n.max(1) {
            acc += 1.0 / (k as f64).powf(skew);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// The 0-based seller for a uniform draw `u` in [0, 1).
    pub fn pick(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|c| *c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// The id of the `k`th seller (0-based; seller-0 sends the most).
pub fn seller_id(k: usize) -> String {
    format!("seller-{k}")
}

/// The id of the `i`th job of run `run_id`.
pub fn job_id(run_id: &str, i: u64) -> String {
    format!("{run_id}-{i}")
}

/// `(seller, job id)` from a record key this generator wrote
/// (`seller/job_id`), which malformed records carry too: a dead letter's
/// key says whose job it was even when its value says nothing.
pub fn parse_key(key: &[u8]) -> Option<(&str, &str)> {
    std::str::from_utf8(key).ok()?.split_once('/')
}

/// The `i`th record of a run: `(key, value)`. Malformed ones come in the
/// kinds a producer bug makes: not JSON, no seller, an empty object.
pub fn record(
    spec: &LoadSpec,
    zipf: &Zipf,
    i: u64,
    u_seller: f64,
    u_bad: f64,
) -> (String, Vec<u8>) {
    let seller = seller_id(zipf.pick(u_seller));
    let job_id = job_id(&spec.run_id, i);
    let key = format!("{seller}/{job_id}");
    if u_bad < spec.malformed {
        let bad = match i % 3 {
            0 => b"{\"job_id\": \"".to_vec(),
            1 => format!("{{\"job_id\": \"{job_id}\", \"payload\": {{}}}}").into_bytes(),
            _ => b"{}".to_vec(),
        };
        return (key, bad);
    }
    let value = serde_json::json!({
        "job_id": job_id,
        "seller_id": seller,
        "payload": { "sku": job_id, "filler": "x".repeat(spec.payload_bytes) },
    });
    (key, value.to_string().into_bytes())
}

/// Writes the run to `topic`, paced to `spec.rate`, showing progress.
/// Returns how many records were written; fails with the first write the
/// broker refused (the load's one failure, so no error type of its own).
pub async fn run(sink: &RecordSink, topic: &str, spec: &LoadSpec) -> Result<u64, SinkError> {
    let bar = ProgressBar::new(spec.jobs);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} jobs {per_sec} eta {eta}")
            .expect("a valid template"),
    );
    run_with_progress(sink, topic, spec, bar).await
}

/// [`run`] with the caller's progress bar: the demo passes a hidden one and
/// reads its position into its own view.
pub async fn run_with_progress(
    sink: &RecordSink,
    topic: &str,
    spec: &LoadSpec,
    bar: ProgressBar,
) -> Result<u64, SinkError> {
    let zipf = Zipf::new(spec.sellers, spec.skew);
    bar.set_length(spec.jobs);
    let started = Instant::now();
    // Up to this many writes in flight: a paced run stays on its pace, a
    // fast one keeps the producer's queue busy.
    const WINDOW: usize = 512;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut written = 0u64;
    use futures::StreamExt;
    for i in 0..spec.jobs {
        if spec.rate > 0.0 {
            let due = started + Duration::from_secs_f64(i as f64 / spec.rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let (key, value) = record(spec, &zipf, i, rand::random(), rand::random());
        in_flight.push(async move { sink.produce(topic, key.as_bytes(), &value).await });
        while in_flight.len() >= WINDOW {
            if let Some(r) = in_flight.next().await {
                r?;
                written += 1;
                bar.inc(1);
            }
        }
    }
    while let Some(r) = in_flight.next().await {
        r?;
        written += 1;
        bar.inc(1);
    }
    bar.finish();
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(malformed: f64) -> LoadSpec {
        LoadSpec {
            jobs: 0,
            sellers: 100,
            skew: 1.0,
            rate: 0.0,
            malformed,
            payload_bytes: 16,
            run_id: "t".into(),
        }
    }

    #[test]
    fn zipf_gives_the_first_seller_its_share() {
        let z = Zipf::new(100, 1.0);
        let n = 100_000;
        let first = (0..n)
            .filter(|i| z.pick((*i as f64 + 0.5) / n as f64) == 0)
            .count() as f64
            / n as f64;
        // 1 / H(100) = 0.193...
        assert!((first - 0.1928).abs() < 0.002, "{first}");
        let uniform = Zipf::new(4, 0.0);
        assert_eq!(uniform.pick(0.0), 0);
        assert_eq!(uniform.pick(0.3), 1);
        assert_eq!(uniform.pick(0.99), 3);
    }

    #[test]
    fn records_parse_or_are_malformed_as_asked() {
        let z = Zipf::new(100, 1.0);
        let settings = crate::config::load_from(None, Vec::new())
            .unwrap()
            .settings
            .worker;
        let good = spec(0.0);
        for i in 0..30 {
            let (_, v) = record(&good, &z, i, 0.5, 0.5);
            crate::job::Job::parse(&v, &settings).expect("a valid job");
        }
        let bad = spec(1.0);
        for i in 0..30 {
            let (_, v) = record(&bad, &z, i, 0.5, 0.5);
            assert!(crate::job::Job::parse(&v, &settings).is_err());
        }
    }
}
