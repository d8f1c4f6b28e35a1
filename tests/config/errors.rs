//! A bad config stops startup with the file, the key and what is wrong:
//! one case per kind of mistake, through the same path `run` uses.

use std::io::Write;

use throttle_worker::config::{self, ConfigError};
use throttle_worker::limiter::Policy;

fn load(toml: &str) -> (Result<Policy, ConfigError>, String) {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(toml.as_bytes()).unwrap();
    let path = f.path().display().to_string();
    let result = config::load_from(Some(f.path()), Vec::new()).and_then(|l| Policy::load(&l));
    (result, path)
}

#[test]
fn each_invalid_rule_has_its_own_error() {
    // (row, [limits] body, key that must be named, words the problem must contain)
    let rows: &[(u32, &str, &str, &str)] = &[
        (1, r#"default = [{ algorithm = "gcra", limit = 0, period = "1s" }]"#, "limits.default[0].limit", "at least 1"),
        (2, r#"default = [{ algorithm = "leaky", limit = 5, period = "1s" }]"#, "limits.default[0].algorithm", "unknown algorithm \"leaky\""),
        (3, r#"default = [{ algorithm = "burst_fill", limit = 1, period = "10us" }]"#, "limits.default[0].period", "below the minimum of 50µs"),
        (4, r#"default = [{ algorithm = "gcra", limit = 5, period = "1s", burts = 3 }]"#, "limits.default[0]", "burts"),
        (5, r#"default = [{ algorithm = "fixed_window", limit = 5, period = "1s", burst = 3 }]"#, "limits.default[0].burst", "only meaningful"),
        (6, r#"default = [{ algorithm = "gcra", limit = 5, period = "soon" }]"#, "limits.default[0].period", "invalid duration \"soon\""),
        (7, r#"default = []"#, "limits.default", "at least one rule"),
        (8, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { tier = \"gold\" }", "limits.sellers.s1.tier", "unknown tier \"gold\""),
        (9, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { unlimited = true, rules = [{ algorithm = \"gcra\", limit = 1, period = \"1s\" }] }", "limits.sellers.s1", "only one of"),
        (10, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.tiers]\nbulk = [{ algorithm = \"token_bucket\", limit = 5, period = \"1s\", burst = 0 }]", "limits.tiers.bulk[0].burst", "burst must be at least 1"),
        (11, r#"default = [{ algorithm = "gcra", limit = 200, period = "100us" }]"#, "limits.default[0].limit", "more than one admission per microsecond"),
        (12, r#"default = [{ algorithm = "gcra", limit = 5, period = "1s" }, { algorithm = "gcra", limit = 5, period = "1s" }]"#, "limits.default[1]", "listed twice"),
        (13, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { max_in_flight = 0 }", "limits.sellers.s1.max_in_flight", "at least 1"),
        (14, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.max_in_flight]\ngold = 3", "limits.max_in_flight.gold", "neither \"default\" nor a tier"),
        (15, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\nslot_lease = \"5s\"", "limits.slot_lease", "longer than downstream.timeout"),
        (16, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = {}", "limits.sellers.s1", "max_in_flight = N"),
        (17, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.weight]\ngold = 3", "limits.weight.gold", "neither \"default\" nor a tier"),
        (18, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.weight]\ndefault = 0", "limits.weight.default", "from 1 to 10000"),
        (19, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { weight = 0 }", "limits.sellers.s1.weight", "from 1 to 10000"),
        (20, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.min_share]\ndefault = 1.0", "limits.min_share.default", "less than 1"),
        (21, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { min_share = -0.1 }", "limits.sellers.s1.min_share", "at least 0"),
        (22, "default = [{ algorithm = \"gcra\", limit = 5, period = \"1s\" }]\n[limits.sellers]\n\"s1\" = { min_share = 0.6 }\n\"s2\" = { min_share = 0.6 }", "limits.sellers.s2.min_share", "more than all the slots"),
    ];
    for &(row, body, key, problem) in rows {
        let (result, path) = load(&format!("[limits]\n{body}\n"));
        let err = result
            .err()
            .unwrap_or_else(|| panic!("row {row}: {body} must be refused"));
        let text = err.to_string();
        assert!(
            text.contains(key),
            "row {row}: error must name key {key:?}: {text}"
        );
        assert!(
            text.contains(problem),
            "row {row}: error must say {problem:?}: {text}"
        );
        assert!(
            text.contains(&path),
            "row {row}: error must name the file {path}: {text}"
        );
    }
}

#[test]
fn the_issue_example_loads() {
    let (result, _) = load(
        r#"
[limits]
default = [{ algorithm = "sliding_window_log", limit = 100, period = "1m" }]
global = [{ algorithm = "gcra", limit = 2000, period = "1s" }]
[limits.tiers]
bulk = [{ algorithm = "token_bucket", limit = 600, period = "1m", burst = 50 },
        { algorithm = "fixed_window", limit = 20000, period = "1d" }]
[limits.sellers]
"seller-42" = { tier = "bulk" }
"seller-7"  = { rules = [{ algorithm = "gcra", limit = 10, period = "1s", burst = 5 }] }
"internal"  = { unlimited = true }
"#,
    );
    let policy = result.expect("the documented example must load");
    use throttle_worker::limiter::Resolved;
    match policy.resolve("seller-42") {
        Resolved::Limited { seller, global } => {
            assert_eq!((seller.len(), global.len()), (2, 1));
        }
        other => panic!("seller-42: {other:?}"),
    }
    assert_eq!(policy.resolve("internal"), Resolved::Unlimited);
    match policy.resolve("anyone") {
        Resolved::Limited { seller, .. } => assert_eq!(seller[0].limit().get(), 100),
        other => panic!("{other:?}"),
    }
}

/// Issue 50: an ordering key source that is none of the three forms, or
/// an unknown ordering, stops startup naming the file and the key.
#[test]
fn a_bad_ordering_names_its_key() {
    // (row, [worker] body, key that must be named, words the problem must contain)
    let rows: &[(u32, &str, &str, &str)] = &[
        (
            1,
            r#"ordering_key = "payload.sku""#,
            "worker.ordering_key",
            "JSON pointer",
        ),
        (
            2,
            r#"ordering_key = "header:""#,
            "worker.ordering_key",
            "needs a header name",
        ),
        (
            3,
            r#"ordering_key = "/payload/~2""#,
            "worker.ordering_key",
            "RFC 6901",
        ),
        (4, r#"ordering = "product""#, "worker.ordering", "product"),
    ];
    for &(row, body, key, problem) in rows {
        let (result, path) = load(&format!("[worker]\n{body}\n"));
        let text = result
            .err()
            .unwrap_or_else(|| panic!("row {row}: {body} must be refused"))
            .to_string();
        for want in [key, problem, path.as_str()] {
            assert!(
                text.contains(want),
                "row {row}: error must say {want:?}: {text}"
            );
        }
    }
    let (ok, _) = load("[worker]\nordering = \"seller\"\nordering_key = \"header:product-id\"\n");
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// Issue 52: `redis.state_loss_wait` is `"period"` or a duration above
/// zero; anything else stops startup naming the file and the key.
#[test]
fn a_bad_state_loss_wait_names_its_key() {
    let rows: &[(u32, &str, &str)] = &[
        (1, r#"state_loss_wait = "0s""#, "above zero"),
        (
            2,
            r#"state_loss_wait = "periodic""#,
            "invalid duration \"periodic\"",
        ),
    ];
    for &(row, body, problem) in rows {
        let (result, path) = load(&format!("[redis]\n{body}\n"));
        let text = result
            .err()
            .unwrap_or_else(|| panic!("row {row}: {body} must be refused"))
            .to_string();
        for want in ["redis.state_loss_wait", problem, path.as_str()] {
            assert!(
                text.contains(want),
                "row {row}: error must say {want:?}: {text}"
            );
        }
    }
    for ok in [r#"state_loss_wait = "period""#, r#"state_loss_wait = "5s""#] {
        let (loaded, _) = load(&format!("[redis]\n{ok}\n"));
        assert!(loaded.is_ok(), "{ok}: {:?}", loaded.err());
    }
}
