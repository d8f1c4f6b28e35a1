//! `max_in_flight` end to end (issue 22, part 3): four worker processes
//! against a `dev-broker`, real Redis and an in-test downstream that
//! answers in 200 ms and counts each seller's calls under way. One seller
//! is capped at 3 calls in flight; another is not. Then a replica holding
//! a slot of the capped seller is killed with -9: its slot comes back when
//! its lease lapses, and the seller is back at 3 in flight.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo test --test worker worker::in_flight:: -- --nocapture
//! ```

use std::time::{Duration, Instant};

use crate::common::procs::{
    start_worker, wait_settled, BrokerProc, Names, Proc, Scratch, TaggedDownstream,
};
use crate::common::worker::{job, produce};

const PARTITIONS: i32 = 8;
const CAP: i64 = 3;
/// `limits.slot_lease`: above the workers' `downstream.timeout` (5 s).
const LEASE: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_never_exceed_a_sellers_max_in_flight_and_a_killed_replicas_slots_lapse() {
    let n = Names::new("inflight");
    let dir = Scratch::new("inflight");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    let down = TaggedDownstream::start(Duration::from_millis(200)).await;
    let config = n
        .config(
            &broker.bootstrap,
            r#"[{ algorithm = "gcra", limit = 1000, period = "1s", burst = 100 }]"#,
            "5s",
        )
        .write(dir.path(), "worker");
    // [limits] is the file's last table: the cap goes after it.
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    text.push_str(&format!(
        "slot_lease = \"{}s\"\n[limits.sellers]\n\"capped\" = {{ max_in_flight = {CAP} }}\n",
        LEASE.as_secs()
    ));
    std::fs::write(&config, text).expect("write the config");

    let names = ["w0", "w1", "w2", "w3"];
    let mut workers: Vec<Proc> = names
        .iter()
        .map(|w| start_worker(dir.path(), w, &config, &down.url(w)))
        .collect();
    wait_settled(
        &workers.iter().collect::<Vec<_>>(),
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(30),
    )
    .await;
    // Each record keyed by a random product: both sellers' jobs spread
    // over every partition, so every replica has work of both.
    let per_seller = 200;
    let mut records = Vec::new();
    for i in 0..per_seller {
        records.push(job(&format!("c-{i}"), "capped"));
        records.push(job(&format!("f-{i}"), "free"));
    }
    produce(&broker.bootstrap, &n.jobs, &records).await;
    let started = Instant::now();

    // Until a third of the capped seller's jobs arrived: sample how many
    // of its calls are under way (the downstream also keeps the most).
    let arrived = |seller: &str| {
        down.arrivals()
            .iter()
            .filter(|(_, a)| a.seller == seller)
            .map(|(_, a)| a.job_id.clone())
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    let mut at_cap = 0u32;
    while arrived("capped") < per_seller / 3 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the capped seller's jobs stalled"
        );
        if down.in_flight("capped").0 == CAP {
            at_cap += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before_kill = started.elapsed();
    assert!(
        at_cap > 0,
        "the capped seller never had {CAP} calls under way: the cap was never reached"
    );

    // Kill -9 a replica while it holds a slot of the capped seller (a call
    // under way at the downstream). Its slot stays taken in Redis until
    // its lease lapses.
    let victim = loop {
        if let Some(i) = names
            .iter()
            .position(|w| down.in_flight_from(w, "capped") > 0)
        {
            break i;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no replica held a slot to kill"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    workers[victim].kill9();
    let killed = Instant::now();
    // Seen at the downstream from the kill on: did the seller reach its cap
    // again (the lapsed slot is back), and when?
    let mut back_at_cap: Option<Duration> = None;
    let deadline = killed + Duration::from_secs(120);
    while arrived("capped") < per_seller || arrived("free") < per_seller {
        assert!(
            Instant::now() < deadline,
            "not every job arrived after the kill: capped {}/{per_seller}, free {}/{per_seller}",
            arrived("capped"),
            arrived("free")
        );
        let now = down.in_flight("capped").0;
        // The victim's own call dropped with it; 3 under way after the
        // kill means every slot of the fleet is in use again.
        if back_at_cap.is_none() && now == CAP && killed.elapsed() > Duration::from_millis(300) {
            back_at_cap = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, most_capped) = down.in_flight("capped");
    let (_, most_free) = down.in_flight("free");
    let took = started.elapsed();
    eprintln!(
        "max_in_flight {CAP}, 4 replicas, downstream 200 ms: most calls in flight seen: capped seller {most_capped}, uncapped seller {most_free}; \
         {at_cap} samples at the cap before the kill ({before_kill:?}); replica w{victim} killed -9 holding a slot; \
         back at {CAP} in flight {back_at_cap:?} after the kill (lease {LEASE:?}); every job arrived in {took:?}"
    );
    assert!(
        most_capped <= CAP,
        "the downstream saw {most_capped} calls of the capped seller at once (cap {CAP})"
    );
    assert!(
        most_free > CAP,
        "the uncapped seller was held to another seller's cap ({most_free})"
    );
    let back = back_at_cap
        .expect("the capped seller never had its 3 calls in flight again after the kill");
    assert!(
        back <= LEASE + Duration::from_secs(3),
        "the killed replica's slot came back after {back:?}, later than its lease ({LEASE:?}) allows"
    );
    for w in &mut workers {
        w.kill9();
    }
}
