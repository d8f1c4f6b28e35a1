//! `throttle-worker produce`: the load generator writes the jobs it was
//! asked for, at the asked share of malformed records, with the skew over
//! sellers, to the topic given.


use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::worker::{read_to_end, Bench};
use throttle_worker::job::Job;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_writes_skewed_jobs_and_the_malformed_share() {
    let bench = Bench::new("produce", 2);
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args([
            "produce",
            "--brokers",
            &bench.bootstrap(),
            "--topic",
            &bench.topics.jobs,
        ])
        .args([
            "--jobs",
            "1000",
            "--sellers",
            "20",
            "--skew",
            "1",
            "--malformed",
            "0.1",
        ])
        .args(["--rate", "2000"])
        .output()
        .expect("run throttle-worker produce");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("produced 1000 jobs"), "{stdout}");
    // Paced at 2,000 a second: about half a second, not as fast as it can.
    assert!(
        took >= Duration::from_millis(450),
        "1000 jobs at 2000/s took {took:?}"
    );

    let records = read_to_end(
        &bench.bootstrap(),
        &bench.topics.jobs,
        1000,
        Duration::from_secs(30),
    );
    assert_eq!(records.len(), 1000);
    let worker = throttle_worker::config::load_from(None, Vec::new())
        .unwrap()
        .settings
        .worker;
    let mut per_seller: HashMap<String, usize> = HashMap::new();
    let mut malformed = 0;
    for (value, _) in &records {
        match Job::parse(value, &worker) {
            Ok(job) => *per_seller.entry(job.seller_id.to_string()).or_default() += 1,
            Err(_) => malformed += 1,
        }
    }
    println!("produce: {malformed} malformed of 1000; per seller {per_seller:?}");
    // 10 % of 1000: a binomial with sd ~9.5; 5 sd either side.
    assert!((50..=150).contains(&malformed), "{malformed} malformed");
    // Zipf 1 over 20 sellers: seller-0 has 1/H(20) = 28 % of the jobs,
    // seller-19 1.4 %.
    let top = per_seller.get("seller-0").copied().unwrap_or(0);
    let last = per_seller.get("seller-19").copied().unwrap_or(0);
    assert!(top > 5 * last.max(1), "seller-0 {top}, seller-19 {last}");
}
