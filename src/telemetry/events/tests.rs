//! What the events do to `/metrics`: each event's series, as a scrape
//! reads them.

use crate::telemetry::metrics::metrics;

use super::{ConsumerLag, WorkerConfigured};

/// The sample line of `name` (no labels) in an exposition.
fn sample<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
}

#[test]
fn the_buffer_bound_is_exported_without_labels() {
    // `ready` is set by the scrape itself: telemetry::http's tests.
    WorkerConfigured {
        max_buffered_bytes: 134_217_728,
    }
    .emit();
    let text = metrics().render();
    assert_eq!(
        sample(&text, "throttle_max_buffered_bytes"),
        Some("134217728"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE throttle_max_buffered_bytes gauge"),
        "{text}"
    );
}

/// A worker's two consumers report their lag each on its own: the
/// retry consumer's report must not drop the jobs topic's series (the
/// lag alerts and the KEDA scaler read them), and a revoked partition's
/// series drops out with its consumer's next report.
#[test]
fn each_consumer_s_lag_report_keeps_the_other_s_series() {
    let group = "lag-two-consumers";
    let series = |topic: &str, p: i32| {
        format!("throttle_consumer_lag_messages{{group=\"{group}\",topic=\"{topic}\",partition=\"{p}\"}}")
    };
    ConsumerLag {
        group,
        partitions: &[("lag-jobs", 0, 7, 1.0), ("lag-jobs", 1, 3, 0.5)],
        gone: &[],
    }
    .emit();
    ConsumerLag {
        group,
        partitions: &[("lag-jobs.retry.5s", 0, 2, 0.1)],
        gone: &[],
    }
    .emit();
    let text = metrics().render();
    for s in [
        series("lag-jobs", 0),
        series("lag-jobs", 1),
        series("lag-jobs.retry.5s", 0),
    ] {
        assert!(text.contains(&s), "{s} missing:\n{text}");
    }
    // The jobs consumer lost partition 1.
    ConsumerLag {
        group,
        partitions: &[("lag-jobs", 0, 7, 1.0)],
        gone: &[("lag-jobs", 1)],
    }
    .emit();
    let text = metrics().render();
    assert!(!text.contains(&series("lag-jobs", 1)), "{text}");
    assert!(text.contains(&series("lag-jobs", 0)), "{text}");
    assert!(text.contains(&series("lag-jobs.retry.5s", 0)), "{text}");
    assert!(
        text.contains(&format!(
            "throttle_consumer_topic_lag_messages{{group=\"{group}\",topic=\"lag-jobs\"}} 7"
        )),
        "{text}"
    );
}
