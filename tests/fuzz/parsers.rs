//! Fuzzing the service's input edges (issue 6 "Fuzz"): the job envelope
//! parser, the `Retry-After` parser and the config loader must never panic,
//! whatever a producer, a downstream or an operator hands them, and what
//! they accept must hold the invariants the worker relies on.
//!
//! Generators build structured, near-valid inputs (JSON objects with odd
//! members, huge numbers, unicode, control characters, deep nesting, wrong
//! types; `Retry-After` digits, signs, dates, garbage; config keys and
//! values) and then mutate some of them, besides plain random bytes.
//!
//! `FUZZ_CASES` sets the cases of the parser targets (the config targets run
//! 1/20 and 1/100 of it; default 2000, a few seconds in
//! CI). docs/src/internals/fuzzing.md has the command for a run of 10 million inputs.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use throttle_worker::config;
use throttle_worker::downstream::{parse_retry_after, retry_after, RetryAfter};
use throttle_worker::job::{Job, JobError, Limits};

/// Cases per target from `FUZZ_CASES`; small by default so CI stays fast.
fn cases(scale_down: u32) -> u32 {
    let n = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(2000);
    (n / scale_down).max(1)
}

/// Runs `test` over `strategy` and prints the rate, so a long run reports
/// its own figures (`--nocapture`).
fn fuzz<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config {
        cases,
        // Failures are pinned as named regression tests instead.
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    });
    let started = Instant::now();
    let result = runner.run(&strategy, test);
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "fuzz {name}: {cases} inputs in {secs:.1} s ({:.0}/s)",
        f64::from(cases) / secs.max(1e-9)
    );
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
}

/// One edit applied to an otherwise generated text: (where, what, char).
type Mutation = Option<(Index, u8, char)>;

fn mutate(mut text: String, mutation: Mutation) -> String {
    let Some((at, op, c)) = mutation else {
        return text;
    };
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let i = bounds[at.index(bounds.len())];
    match op % 4 {
        0 => text.truncate(i),
        1 => text.insert(i, c),
        2 => {
            if i < text.len() {
                text.remove(i);
            }
        }
        _ => {
            let tail = text[i..].to_owned();
            text.push_str(&tail);
        }
    }
    text
}

// ---------------------------------------------------------------- JSON ----

/// `len` pseudo-random decimal digits from `seed`. Regex strategies make a
/// shrink node per character, which made long digit runs the bottleneck.
fn digits(len: usize, mut seed: u64) -> String {
    (0..len)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'0' + (seed >> 60) as u8 % 10)
        })
        .collect()
}

/// Long numbers of every JSON shape (and some non-JSON ones): sign,
/// integer part up to 400 digits, fraction, exponent.
fn long_number() -> BoxedStrategy<String> {
    (
        any::<bool>(),
        1usize..400,
        any::<u64>(),
        0u8..4,
        0u8..6,
        1usize..6,
    )
        .prop_map(|(neg, len, seed, frac, exp, exp_len)| {
            let mut n = if neg { "-".to_owned() } else { String::new() };
            n.push_str(&digits(len, seed));
            if frac == 1 {
                n.push('.');
                n.push_str(&digits(len % 20, !seed));
            }
            let e = ["", "e", "E+", "e-", "", ""][exp as usize];
            if !e.is_empty() {
                n.push_str(e);
                n.push_str(&digits(exp_len, seed.rotate_left(7)));
            }
            n
        })
        .boxed()
}

/// Short arbitrary text: unicode, control characters, quotes, backslashes.
fn text() -> BoxedStrategy<String> {
    prop::collection::vec(
        prop_oneof![
            3 => any::<char>(),
            2 => prop::sample::select(vec!['"', '\\', '\n', '\0', '\u{7f}', '\u{2028}', 'é', '€', '😀', 'a', ':', ',']),
        ],
        0..12,
    )
    .prop_map(String::from_iter)
    .boxed()
}

fn json_number() -> BoxedStrategy<String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        long_number(),
        prop::sample::select(vec![
            "0",
            "-0",
            "1",
            "2.5",
            "2.0",
            "1e9",
            "1E2",
            "-1",
            "1e999",
            "-1e-999",
            "01",
            "1.",
            ".5",
            "+1",
            "NaN",
            "Infinity",
            "0x10",
            "18446744073709551616",
            "10000",
            "10001",
        ])
        .prop_map(str::to_owned),
    ]
    .boxed()
}

fn json_string() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "\"j-1\"",
            "\"s\"",
            "\"\"",
            "\"a\\u0000b\"",
            "\"\\ud800\"",
            "\"\\ud83d\\ude00\"",
            "\"\\x\"",
            "\"\\\"\""
        ])
        .prop_map(str::to_owned),
        // Valid JSON for any text: unicode, control characters, escapes.
        text().prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        // Raw, unescaped: control characters inside quotes are invalid JSON.
        text().prop_map(|s| format!("\"{s}\"")),
    ]
    .boxed()
}

fn json_value() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["null", "true", "false"]).prop_map(str::to_owned),
        json_number(),
        json_string(),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((json_string(), inner), 0..6).prop_map(|v| {
                let members: Vec<String> = v.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
    .boxed()
}

/// Nesting far beyond serde_json's recursion limit (128), closed or not.
fn deep() -> BoxedStrategy<String> {
    (1usize..2000, any::<bool>(), any::<bool>())
        .prop_map(|(depth, arrays, closed)| {
            let (open, close) = if arrays { ("[", "]") } else { ("{\"a\":", "}") };
            let mut s = open.repeat(depth);
            s.push('1');
            if closed {
                s.push_str(&close.repeat(depth));
            }
            s
        })
        .boxed()
}

fn member() -> BoxedStrategy<(String, String)> {
    let id = prop_oneof![
        4 => (0u32..1000).prop_map(|n| format!("\"id-{n}\"")),
        1 => json_value(),
    ];
    prop_oneof![
        3 => id.clone().prop_map(|v| ("\"job_id\"".to_owned(), v)),
        3 => id.prop_map(|v| ("\"seller_id\"".to_owned(), v)),
        3 => prop_oneof![json_value(), deep()].prop_map(|v| ("\"payload\"".to_owned(), v)),
        3 => prop_oneof![3 => json_number(), 1 => json_value()]
            .prop_map(|v| ("\"cost\"".to_owned(), v)),
        1 => (json_string(), json_value()),
    ]
    .boxed()
}

fn envelope() -> BoxedStrategy<Vec<u8>> {
    let object = (
        prop::collection::vec(member(), 0..7),
        prop::option::weighted(0.3, (any::<Index>(), any::<u8>(), any::<char>())),
    )
        .prop_map(|(members, mutation)| {
            let inner: Vec<String> = members
                .into_iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            mutate(format!("{{{}}}", inner.join(",")), mutation).into_bytes()
        });
    prop_oneof![
        8 => object,
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => prop_oneof![json_value(), deep()].prop_map(String::into_bytes),
    ]
    .boxed()
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        prop_oneof![1usize..4096, Just(usize::MAX)],
        prop_oneof![1u64..20_000, Just(u64::MAX)],
    )
        .prop_map(|(max_payload_bytes, max_job_cost)| Limits {
            max_payload_bytes,
            max_job_cost,
        })
}

#[test]
fn fuzz_job_parse_never_panics_and_keeps_its_invariants() {
    fuzz(
        "job",
        cases(1),
        (envelope(), limits()),
        |(value, limits)| {
            match Job::parse(&value, limits) {
                Ok(job) => {
                    prop_assert!((1..=limits.max_job_cost).contains(&job.cost));
                    prop_assert!(job.payload_bytes().len() <= limits.max_payload_bytes);
                    for id in [job.job_id.as_str(), job.seller_id.as_str()] {
                        prop_assert!(!id.is_empty() && !id.chars().any(char::is_control));
                    }
                }
                Err(e) => {
                    // x-error is a Kafka header: it must stay short whatever
                    // the record held, and a cost error must name the field.
                    let text = e.to_string();
                    prop_assert!(text.len() <= 512, "{} byte error: {text:.200}", text.len());
                    if let JobError::BadCost { .. } = e {
                        prop_assert!(text.contains("cost"), "{text}");
                    }
                }
            }
            Ok(())
        },
    );
}

// --------------------------------------------------------- Retry-After ----

fn http_date() -> BoxedStrategy<String> {
    (0u64..253_402_300_800)
        .prop_map(|s| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(s)))
        .boxed()
}

fn retry_after_value() -> BoxedStrategy<String> {
    let obsolete = (
        prop::sample::select(vec!["Sun", "Mon", "Sunday", "Monday", "Xyz"]),
        0u32..40,
        prop::sample::select(vec!["Jan", "Feb", "Nov", "Foo"]),
        0u32..10_000,
        0u32..30,
        0u32..70,
        0u32..70,
    )
        .prop_map(|(d, day, m, y, h, mi, s)| {
            // RFC 850 and asctime forms, with out-of-range fields.
            if day % 2 == 0 {
                format!("{d}, {day:02}-{m}-{:02} {h:02}:{mi:02}:{s:02} GMT", y % 100)
            } else {
                format!("{d} {m} {day:>2} {h:02}:{mi:02}:{s:02} {y}")
            }
        });
    let base = prop_oneof![
        "[0-9]{1,40}",
        "[-+ \t]{0,3}[0-9]{0,30}[ .,eE]{0,2}[0-9]{0,3}[ \t]{0,2}",
        http_date(),
        obsolete,
        any::<String>(),
        "\\PC{0,24}",
    ];
    (
        base,
        prop::option::weighted(0.2, (any::<Index>(), any::<u8>(), any::<char>())),
    )
        .prop_map(|(v, m)| mutate(v, m))
        .boxed()
}

#[test]
fn fuzz_retry_after_never_panics_and_every_wait_is_bounded() {
    let week = 7 * 24 * 3600;
    fuzz(
        "retry_after",
        cases(1),
        (
            prop::collection::vec(retry_after_value(), 0..4),
            0u64..253_402_300_800,
            1u64..=week * 1_000_000_000,
        ),
        |(values, now_s, max_ns)| {
            let now = UNIX_EPOCH + Duration::from_secs(now_s);
            let max = Duration::from_nanos(max_ns);
            for v in &values {
                let parsed = parse_retry_after(v, now);
                let t = v.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    prop_assert!(parsed.is_some(), "digits {t:.40} must be a wait");
                }
            }
            let got = retry_after(values.iter().map(String::as_str), now, max);
            if let RetryAfter::Wait(d) = got {
                prop_assert!(d <= max, "{d:?} over max {max:?}");
                prop_assert!(Instant::now().checked_add(d).is_some());
                prop_assert!(SystemTime::now().checked_add(d).is_some());
            }
            Ok(())
        },
    );
}

// -------------------------------------------------------------- config ----

/// Keys the loader knows (as env suffixes), plus random ones.
fn config_key() -> BoxedStrategy<String> {
    let known = prop::sample::select(vec![
        "KAFKA__BROKERS",
        "KAFKA__TOPIC",
        "KAFKA__COMMIT_INTERVAL",
        "KAFKA__PROPERTIES__SASL__PASSWORD",
        "REDIS__URL",
        "REDIS__KEY_PREFIX",
        "REDIS__TOPOLOGY",
        "REDIS__TIMEOUT",
        "DOWNSTREAM__URL",
        "DOWNSTREAM__TIMEOUT",
        "DOWNSTREAM__CONCURRENCY",
        "DOWNSTREAM__MAX_ATTEMPTS",
        "DOWNSTREAM__BACKOFF_BASE",
        "DOWNSTREAM__MAX_BACKOFF",
        "DOWNSTREAM__MAX_RETRY_AFTER",
        "HTTP__LISTEN",
        "WORKER__MAX_BUFFERED",
        "WORKER__MAX_INLINE_DELAY",
        "WORKER__MAX_PAYLOAD_BYTES",
        "WORKER__MAX_JOB_COST",
        "LIMITS__DEFAULT",
        "LIMITS__SELLERS__S1__TIER",
        "LIMITS",
        "",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        6 => known,
        1 => "[A-Z_]{0,10}(__[A-Za-z0-9_]{0,8}){0,3}",
        1 => "\\PC{0,12}",
    ]
    .boxed()
}

fn config_scalar() -> BoxedStrategy<String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{15,40}",
        any::<f64>().prop_map(|n| n.to_string()),
        "-?[0-9]{1,6}(\\.[0-9]{1,3})?(ns|us|ms|s|m|h|d|w|y|years| )?",
        prop::sample::select(vec![
            "0s",
            "1h",
            "-1s",
            "99999999999999y",
            "18446744073709551615s",
            "1.5s",
            "true",
            "single",
            "cluster",
            "http://127.0.0.1:1/x",
            "127.0.0.1:0",
            "[::1]:0",
            "",
            " ",
            "[1,2]",
            "{a=1}",
            "redis://u:p@h:1",
        ])
        .prop_map(str::to_owned),
        any::<String>(),
    ]
    .boxed()
}

#[test]
fn fuzz_config_from_environment_never_panics() {
    fuzz(
        "config_env",
        cases(20),
        prop::collection::vec((config_key(), config_scalar()), 0..5),
        |vars| {
            let env = vars.into_iter().map(|(k, v)| (format!("THROTTLE__{k}"), v));
            check_loaded(config::load_from(None, env))
        },
    );
}

fn toml_value() -> BoxedStrategy<String> {
    let scalar = prop_oneof![
        config_scalar().prop_map(|s| format!("{s:?}")),
        config_scalar(),
        prop::sample::select(vec![
            "inf",
            "-nan",
            "1979-05-27T07:32:00Z",
            "0x7f",
            "1_000",
            "9223372036854775808",
            "-9223372036854775809",
            "'''multi\nline'''",
            "\"\\u0000\"",
            "\"\\uD800\"",
        ])
        .prop_map(str::to_owned),
    ];
    scalar
        .prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(", "))),
                prop::collection::vec(("[a-z_]{1,8}", inner), 0..4).prop_map(|v| {
                    let kv: Vec<String> =
                        v.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    format!("{{ {} }}", kv.join(", "))
                }),
            ]
        })
        .boxed()
}

fn toml_document() -> BoxedStrategy<String> {
    let section = prop::sample::select(vec![
        "kafka",
        "kafka.properties",
        "redis",
        "downstream",
        "http",
        "worker",
        "limits",
        "limits.tiers",
        "limits.sellers",
        "limits.sellers.\"s 1\"",
        "[limits.default]",
        "nope",
    ]);
    let key = prop_oneof![
        4 => prop::sample::select(vec![
            "brokers", "topic", "url", "timeout", "concurrency", "max_attempts",
            "backoff_base", "max_backoff", "max_retry_after", "max_buffered",
            "max_payload_bytes", "max_job_cost", "listen", "default", "global",
            "algorithm", "limit", "period", "burst", "tier", "unlimited", "rules",
            "key_prefix", "topology",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
        1 => "\"\\PC{0,8}\"",
    ];
    let table =
        (section, prop::collection::vec((key, toml_value()), 0..5)).prop_map(|(name, kv)| {
            let mut text = format!("[{name}]\n");
            for (k, v) in kv {
                text.push_str(&format!("{k} = {v}\n"));
            }
            text
        });
    (
        prop::collection::vec(table, 0..4),
        prop::option::weighted(0.2, (any::<Index>(), any::<u8>(), any::<char>())),
    )
        .prop_map(|(tables, m)| mutate(tables.concat(), m))
        .boxed()
}

#[test]
fn fuzz_config_from_toml_files_never_panics() {
    let file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    let path = file.path().to_owned();
    fuzz("config_toml", cases(100), toml_document(), |text| {
        std::fs::write(&path, &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_loaded(config::load_from(Some(&path), Vec::new()))
    });
}

/// What a successful load guarantees to the rest of the service.
fn check_loaded(result: Result<config::Loaded, config::ConfigError>) -> Result<(), TestCaseError> {
    match result {
        Ok(loaded) => {
            let s = &loaded.settings;
            prop_assert!(!s.downstream.max_retry_after.is_zero());
            prop_assert!(Instant::now()
                .checked_add(s.downstream.max_retry_after)
                .is_some());
            prop_assert!(s.worker.max_job_cost >= 1);
            prop_assert!(s.downstream.concurrency >= 1);
            prop_assert!(s.downstream.max_backoff >= s.downstream.backoff_base);
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}
