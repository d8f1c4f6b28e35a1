//! Restores on the simulation's Redis, call by call: a case a random
//! world found, pinned.

use throttle_worker::config::Topology;
use throttle_worker::limiter::{
    Algorithm, JobsCall, JobsRequest, KeySpace, Loss, RestoreCall, Rule,
};

use super::ports::sim_redis;

/// A clock reading far from zero, as Redis' is.
const T: u64 = 1_793_491_200_000_000;
const S: u64 = 1_000_000;

/// Fleet seed 46: two replicas' parts of a token bucket, each within the
/// bucket's capacity, restored after a loss, together took more than the
/// bucket holds (a replica's grants 19 s before the loss had refilled
/// before the other's); the bucket went below zero, and the next jobs
/// call's refusal said `remaining` -1, which the product reads as a
/// malformed reply (every call of the seller failed until it refilled).
/// A refusal now says 0 left.
#[test]
fn restored_parts_past_a_buckets_capacity_leave_a_refusal_readable() {
    let redis = sim_redis();
    let keys = KeySpace::new("sim");
    let rule = Rule::new(
        Algorithm::TokenBucket,
        1,
        std::time::Duration::from_secs(10),
        Some(2),
    )
    .expect("a sound rule");
    let rules = keys.own_rules("s", &[rule]);
    let epoch = keys.epoch(Topology::Single, "");
    let lost = T;
    redis
        .command(&["SET", &epoch, &lost.to_string()], T)
        .expect("SET the epoch");
    let restore = |replica: &str, part: Vec<(u64, u64)>, at: u64| {
        let call = RestoreCall {
            now_us: Some(at),
            replica: replica.to_owned(),
            loss: Loss::Epoch(lost),
            bound_us: 3 * S,
            epoch: epoch.clone(),
            server: Some(keys.server()),
            rules: vec![(rules[0].clone(), part)],
            mark: None,
        };
        redis.restore(&call, at).expect("the restore runs")
    };
    assert_eq!(
        restore("a", vec![(T - 19 * S, 2)], T + 1_000),
        vec![2],
        "a's part"
    );
    assert_eq!(
        restore("b", vec![(T - S, 1)], T + 2_000),
        vec![1],
        "b's part"
    );
    let call = JobsCall {
        now_us: Some(T + 3_000),
        dry_run: false,
        requests: vec![JobsRequest {
            call_id: "c1".to_owned(),
            block: keys.block_at("s"),
            rules: rules.clone(),
            costs: vec![1],
            slots: None,
        }],
        guard: None,
        learn: None,
    };
    let answer = redis
        .run_jobs(&call, None, T + 3_000)
        .expect("a refusal the product can read");
    let head = &answer.replies[0].head;
    assert_eq!((head.status, head.remaining), (0, 0), "{head:?}");
}
