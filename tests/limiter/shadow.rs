//! Shadow mode per rule (issue 8): a rule with `shadow = true` is decided
//! and counted on live traffic, but never holds a job. Its state follows
//! what it would have admitted, `limits show` reports it, `limits reset`
//! clears it, and a rule may not be both enforced and shadow.

use crate::common::{metric, rule, unique_prefix};
use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig};
use throttle_worker::limiter::inspect::RuleKind;
use throttle_worker::limiter::{BatchDecision, Decision, Mode, Policy};

fn shadow(r: RuleConfig) -> RuleConfig {
    RuleConfig { shadow: true, ..r }
}

#[tokio::test]
async fn a_shadow_rule_counts_what_it_would_refuse_and_holds_nothing() {
    let prefix = unique_prefix("shadow");
    let cfg = LimitsConfig {
        default: vec![
            rule("fixed_window", 100, "1m", None),
            shadow(rule("fixed_window", 3, "1m", None)),
        ],
        global: vec![shadow(rule("fixed_window", 6, "1m", None))],
        sellers: [
            (
                "vip".to_owned(),
                SellerConfig {
                    rules: Some(vec![rule("fixed_window", 100, "1m", None)]),
                    ..Default::default()
                },
            ),
            (
                "free".to_owned(),
                SellerConfig {
                    unlimited: true,
                    ..Default::default()
                },
            ),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let limiter = crate::common::limiter(&prefix, Policy::from_config(&cfg).unwrap()).await;
    throttle_worker::telemetry::metrics::name_sellers(["vip", "s", "free"].map(str::to_owned));

    // Five single units: the shadow rule (3 a minute) would have held 2
    // back; every one is granted.
    for i in 0..5 {
        let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
        assert!(matches!(d, Decision::Granted(_)), "unit {i}: {d:?}");
    }
    let units = |seller: &str| {
        metric(
            "throttle_limiter_shadow_denied_units_total",
            &[("tier", "default"), ("seller", seller)],
        )
    };
    assert_eq!(units("s"), 2.0);
    assert_eq!(
        metric(
            "throttle_limiter_decisions_total",
            &[
                ("result", "shadow_denied"),
                ("by", "shadow0"),
                ("tier", "default"),
                ("seller", "s")
            ]
        ),
        2.0,
        "each refusing shadow decision counted once, naming the rule"
    );

    // A job list: 4 jobs granted whole; the seller's shadow rule is spent,
    // so all 4 units are counted as what it would have held back.
    let d = limiter.acquire_jobs("s", &[1, 1, 1, 1]).await.unwrap();
    assert!(
        matches!(d, BatchDecision::Granted(ref g) if g.jobs == 4),
        "{d:?}"
    );
    assert_eq!(units("s"), 6.0);

    // The shadow state is real: 3 taken under the seller's shadow rule,
    // and the global shadow rule, asked in the same call, was charged only
    // with them (the shadow rules decide together, all or nothing, as
    // enforced rules do).
    let state = limiter.inspect("s", None).await.unwrap();
    assert_eq!(state.tier, "default");
    let of = |kind: RuleKind| {
        state
            .rules
            .iter()
            .find(|r| r.kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} rule in {state:?}"))
            .clone()
    };
    assert_eq!(of(RuleKind::Seller).remaining, 91, "9 units charged");
    let own_shadow = of(RuleKind::Shadow);
    assert_eq!(own_shadow.remaining, 0);
    assert!(!own_shadow.retry_after.is_zero());
    assert_eq!(of(RuleKind::GlobalShadow).remaining, 3);

    // A seller with its own rules has no seller shadow rule, but the
    // global shadow rule counts for it too: 5 units, 3 left under it.
    let d = limiter.acquire("vip", 5, Mode::AllOrNothing).await.unwrap();
    assert!(
        matches!(d, Decision::Granted(ref g) if g.granted == 5),
        "{d:?}"
    );
    assert_eq!(
        metric(
            "throttle_limiter_shadow_denied_units_total",
            &[("tier", "seller"), ("seller", "vip")]
        ),
        2.0
    );

    // An unlimited seller is held by no rule: global shadow rules included.
    let d = limiter
        .acquire("free", 50, Mode::AllOrNothing)
        .await
        .unwrap();
    assert!(matches!(d, Decision::Granted(_)), "{d:?}");
    assert_eq!(
        metric(
            "throttle_limiter_shadow_denied_units_total",
            &[("tier", "unlimited"), ("seller", "free")]
        ),
        0.0
    );

    // A dry run charges no shadow rule either.
    let before = units("s");
    limiter
        .check(throttle_worker::limiter::Request {
            dry_run: true,
            ..throttle_worker::limiter::Request::new("s", 1, Mode::AllOrNothing)
        })
        .await
        .unwrap();
    assert_eq!(units("s"), before);

    // Reset clears the shadow rule's state with the rest.
    let keys = limiter.seller_keys("s");
    assert_eq!(
        keys,
        vec![limiter.keys().seller_state("s"), limiter.keys().slots("s")],
        "the hash (block, rule, shadow rule) and the slots: {keys:?}"
    );
    limiter.store().delete(&keys).await.unwrap();
    let state = limiter.inspect("s", None).await.unwrap();
    assert!(state
        .rules
        .iter()
        .filter(|r| r.kind != RuleKind::GlobalShadow)
        .all(|r| r.remaining == r.rule.capacity()));
}

#[test]
fn a_rule_cannot_be_both_enforced_and_shadow_and_a_set_needs_an_enforced_rule() {
    let both = LimitsConfig {
        default: vec![
            rule("gcra", 10, "1s", None),
            shadow(rule("gcra", 10, "1s", None)),
        ],
        ..Default::default()
    };
    let e = Policy::from_config(&both).unwrap_err();
    assert_eq!(e.key, "limits.default[1]");
    assert!(e.problem.contains("listed twice"), "{e}");

    let only_shadow = LimitsConfig {
        default: vec![shadow(rule("gcra", 10, "1s", None))],
        ..Default::default()
    };
    let e = Policy::from_config(&only_shadow).unwrap_err();
    assert_eq!(e.key, "limits.default");
    assert!(e.problem.contains("not shadow"), "{e}");
}

#[test]
fn tiers_label_sellers_and_cannot_take_a_reserved_name() {
    let cfg = LimitsConfig {
        default: vec![rule("gcra", 10, "1s", None)],
        tiers: [(
            "bulk".to_owned(),
            vec![
                rule("gcra", 50, "1s", None),
                shadow(rule("gcra", 20, "1s", None)),
            ],
        )]
        .into_iter()
        .collect(),
        sellers: [
            (
                "b".to_owned(),
                SellerConfig {
                    tier: Some("bulk".into()),
                    ..Default::default()
                },
            ),
            (
                "u".to_owned(),
                SellerConfig {
                    unlimited: true,
                    ..Default::default()
                },
            ),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let p = Policy::from_config(&cfg).unwrap();
    assert_eq!(p.tier_of("b"), "bulk");
    assert_eq!(p.tier_of("u"), "unlimited");
    assert_eq!(p.tier_of("anyone"), "default");
    assert_eq!(
        p.shadow("b").0.len(),
        1,
        "a tier's shadow rules apply to its sellers"
    );
    assert!(p.shadow("anyone").0.is_empty());

    let reserved = LimitsConfig {
        default: vec![rule("gcra", 10, "1s", None)],
        tiers: [("override".to_owned(), vec![rule("gcra", 5, "1s", None)])]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let e = Policy::from_config(&reserved).unwrap_err();
    assert_eq!(e.key, "limits.tiers.override");
}
