//! The series count of `/metrics` does not grow with the number of sellers
//! (issue 8): only sellers the config names get series of their own. The
//! metrics are process-wide: nextest runs each test in a process of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use throttle_worker::telemetry::events::{
    Backlog, CallAvoided, JobsAdmitted, LimiterNever, SellerThrottled, ShadowDecided,
};
use throttle_worker::telemetry::metrics::{metrics, name_sellers};

fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

#[test]
fn a_hundred_thousand_sellers_leave_the_series_count_bounded() {
    name_sellers(["vip-1".to_owned(), "vip-2".to_owned()]);
    let sellers: Vec<String> = (0..100_000)
        .map(|i| format!("seller-{i}"))
        .chain(["vip-1".to_owned(), "vip-2".to_owned()])
        .collect();
    let emit_all = |sellers: &[String]| {
        for (i, s) in sellers.iter().enumerate() {
            // Tiers come from the config: a handful, whatever the sellers.
            let tier = ["default", "bulk", "seller"][i % 3];
            JobsAdmitted {
                seller: s,
                tier,
                jobs: 1,
                units: 1,
                near_limit: true,
            }
            .emit();
            SellerThrottled {
                seller: s,
                tier,
                retry_after: Duration::from_millis(250),
                waiting: 3,
                by: "rule0",
            }
            .emit();
            LimiterNever {
                seller: s,
                tier,
                rule: 1,
            }
            .emit();
            ShadowDecided {
                seller: s,
                tier,
                units: 2,
                denied: 1,
                by: Some(0),
                error: None,
            }
            .emit();
            CallAvoided { seller: s }.emit();
        }
        let waiting: HashMap<(&'static str, Arc<str>), i64> = sellers
            .iter()
            .map(|s| (("limit", Arc::from(s.as_str())), 3))
            .collect();
        Backlog {
            waiting: &waiting,
            in_flight: 0,
            parked: 0,
            bytes: 0,
            assigned: 4,
            paused: 0,
        }
        .emit();
    };
    emit_all(&sellers[..10]);
    let few = series(&metrics().render());
    emit_all(&sellers);
    let text = metrics().render();
    let many = series(&text);
    println!("series after 10 sellers: {few}; after 100,002: {many}");
    // The named sellers add their own few series (per tier they were seen
    // in), nothing else grows.
    assert!(
        many <= few + 2 * 3 * 8,
        "series grew from {few} to {many} with 100,000 sellers"
    );
    assert!(!text.contains("seller-"), "an unnamed seller got a series");
    assert!(text.contains("seller=\"vip-1\""));
    assert!(text.contains("seller=\"other\""));
    // The aggregate still counts every unnamed seller.
    let other_waiting: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("throttle_jobs_waiting{")
                && l.contains("seller=\"other\"")
                && l.contains("cause=\"limit\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(other_waiting, 300_000.0);
}
