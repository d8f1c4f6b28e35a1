//! `throttle-worker limiter demo`: a live run of every algorithm against
//! Redis, showing grants, refusals with their retry-after, a retry exactly at
//! the retry-after, and the bytes one seller's state takes.

use std::time::{Duration, Instant};

use crate::config::{LimitsConfig, RuleConfig, Topology};
use crate::limiter::policy::InvalidLimits;
use crate::limiter::{
    Algorithm, Decision, KeySpace, Limiter, LimiterError, Mode, Policy, RedisError, RedisStore,
};

/// Why the limiter demo stopped. Each cause says enough on its own (the
/// demo's one Redis, its fixed rules), so the variants add no words.
#[derive(Debug, thiserror::Error)]
pub enum LimiterDemoError {
    /// Connecting, or reading a seller's state.
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// The demo's own rule refused: a bug in the demo.
    #[error(transparent)]
    Rule(#[from] InvalidLimits),
    #[error(transparent)]
    Limiter(#[from] LimiterError<RedisError>),
}

/// Runs the demo, writing to stdout.
pub async fn limiter_demo(redis_url: &str) -> Result<(), LimiterDemoError> {
    let store = RedisStore::connect(redis_url, Duration::from_secs(2)).await?;
    let prefix = format!("tw-demo-{:06x}", rand::random::<u32>() & 0xff_ffff);
    println!(
        "limiter demo against {} (keys under {prefix}:*)",
        crate::config::redact_url(redis_url)
    );
    println!("each algorithm: 5 per second (burst 5), 8 requests at once, then one more at the retry-after\n");
    for algorithm in Algorithm::ALL {
        let burst = algorithm.uses_burst().then_some(5);
        let rule = RuleConfig {
            algorithm: algorithm.name().to_owned(),
            limit: 5,
            period: Duration::from_secs(1),
            burst,
            shadow: false,
        };
        let policy = Policy::from_config(&LimitsConfig {
            default: vec![rule],
            ..Default::default()
        })?;
        let limiter = Limiter::new(
            store.clone(),
            KeySpace::new(prefix.clone()),
            policy,
            Topology::Single,
        );
        let seller = format!("demo-{algorithm}");
        println!("{algorithm}");
        let mut retry = Duration::ZERO;
        for i in 1..=8 {
            let d = limiter.acquire(&seller, 1, Mode::AllOrNothing).await?;
            println!("  #{i} {}", describe(&d));
            if let Decision::Denied(x) = &d {
                retry = x.retry_after;
            }
        }
        if !retry.is_zero() {
            let started = Instant::now();
            tokio::time::sleep(retry).await;
            let d = limiter.acquire(&seller, 1, Mode::AllOrNothing).await?;
            println!("  after {:?}: {}", started.elapsed(), describe(&d));
        }
        let key = limiter.keys().seller_state(&seller);
        let bytes = store.memory_usage(&key).await?.unwrap_or(0);
        println!("  state: {bytes} bytes in Redis for this seller\n");
    }
    Ok(())
}

fn describe(d: &Decision) -> String {
    match d {
        Decision::Granted(g) => match g.pace {
            Some(p) => format!(
                "granted, {} left, may go in {:.1} ms",
                g.remaining,
                p.first_after.as_secs_f64() * 1e3
            ),
            None => format!("granted, {} left", g.remaining),
        },
        Decision::Denied(x) => format!(
            "denied, retry after {} ms ({} µs)",
            x.retry_after_ms(),
            x.retry_after.as_micros()
        ),
        Decision::Never(c) => format!("can never pass: cost {} > capacity {}", c.cost, c.capacity),
    }
}
