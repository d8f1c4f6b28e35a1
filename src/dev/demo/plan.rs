//! What the demo runs: its sellers, each with a role, a rule scaled to the
//! share of the load it gets, and the worker config that names them all.
//!
//! The load is Zipf-skewed (seller-0 sends the most), so the rules are set
//! from each seller's expected demand rather than fixed numbers: whatever
//! `--rate` and `--sellers`, the throttled sellers are held visibly below
//! what they send (75 %: their backlog grows while the load runs and drains
//! in the last third of the run), and the others have twice what they need.

use std::time::Duration;

use crate::config::RuleConfig;
use crate::dev::stub::Throttle;

/// A throttled seller is allowed this share of what it sends: backlog
/// grows at 25 % of its demand during the load and drains at 75 %, in a
/// third of the load's length.
const HELD_SHARE: f64 = 0.75;

/// A seller that should not be throttled gets this many times its demand.
const ROOMY: f64 = 2.0;

/// The downstream stub's window for the seller it throttles is a third of
/// the load (so that even a short run sees its 429s), within these bounds:
/// long enough that its Retry-After exceeds the worker's
/// `max_inline_delay`, so the seller's waiting jobs go round the retry
/// topic, and short enough to drain soon after the load.
const STUB_WINDOW_MIN: Duration = Duration::from_secs(5);
pub const STUB_WINDOW_MAX: Duration = Duration::from_secs(10);

/// The demo replicas' `worker.max_inline_delay`: waits longer than this
/// (the stub's 429s) go to the retry tiers.
const MAX_INLINE_DELAY: &str = "2s";

/// Share of malformed records in the load ("a few"), dead-lettered.
pub const MALFORMED: f64 = 0.01;

/// Zipf exponent of the load over sellers.
pub const SKEW: f64 = 1.0;

/// What a seller shows in the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The heaviest seller, on the `bulk` tier (token bucket with a burst),
    /// held below its demand.
    Bulk,
    /// Its own sliding-window-log rule, held below its demand.
    LimitBound,
    /// A roomy rule, but the downstream stub answers 429 past its own limit.
    Downstream429,
    /// A tight GCRA rule with a small burst, held below its demand.
    Tight,
    /// The `standard` tier (the default rule), with room to spare.
    Standard,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Bulk => "bulk tier",
            Role::LimitBound => "limit-bound",
            Role::Downstream429 => "stub 429s",
            Role::Tight => "tight gcra",
            Role::Standard => "standard",
        }
    }
}

/// One seller of the demo.
#[derive(Debug, Clone)]
pub struct SellerPlan {
    pub id: String,
    pub role: Role,
    /// Jobs per second the load sends it, on average.
    pub demand: f64,
    /// Its one rule (each demo seller has exactly one, so "within its
    /// limit" has one meaning).
    pub rule: RuleConfig,
    /// The tier the config gives it, or `None` for rules of its own.
    pub tier: Option<&'static str>,
    /// The stub's own limit on it, if any.
    pub stub_throttle: Option<Throttle>,
}

impl SellerPlan {
    /// Sustained jobs per second its rule allows.
    pub fn limit_per_sec(&self) -> f64 {
        self.rule.limit as f64 / self.rule.period.as_secs_f64()
    }
}

/// `algorithm limit/period [burst b]`, as the summary shows a rule.
pub fn describe(rule: &RuleConfig) -> String {
    let mut s = format!(
        "{} {}/{}",
        rule.algorithm,
        rule.limit,
        humantime::format_duration(rule.period)
    );
    if let Some(b) = rule.burst {
        s.push_str(&format!(" burst {b}"));
    }
    s
}

/// The whole demo: sellers, load and topics.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sellers: Vec<SellerPlan>,
    /// Jobs per second the load produces.
    pub rate: f64,
    /// How long the load runs.
    pub load_time: Duration,
    /// Jobs the load produces: `rate × load_time`.
    pub jobs: u64,
    /// Partitions of the jobs topic and of each retry tier.
    pub partitions: i32,
}

fn rule(algorithm: &str, limit: f64, burst: Option<f64>) -> RuleConfig {
    let whole = |x: f64| (x.round() as u64).max(1);
    RuleConfig {
        algorithm: algorithm.to_owned(),
        limit: whole(limit),
        period: Duration::from_secs(1),
        burst: burst.map(whole),
        shadow: false,
    }
}

impl Plan {
    /// `sellers` sellers sharing `rate` jobs/s for `load_time`, with
    /// `replicas` workers (two partitions each, at least six).
    pub fn new(rate: f64, sellers: usize, load_time: Duration, replicas: usize) -> Plan {
        let weights: Vec<f64> = (1..=sellers).map(|k| 1.0 / (k as f64).powf(SKEW)).collect();
        let total: f64 = weights.iter().sum();
        let demand: Vec<f64> = weights
            .iter()
            .map(|w| rate * (1.0 - MALFORMED) * w / total)
            .collect();
        let role = |k: usize| match k {
            0 => Role::Bulk,
            1 => Role::LimitBound,
            k if k == sellers - 1 && sellers >= 3 => Role::Tight,
            2 if sellers >= 4 => Role::Downstream429,
            _ => Role::Standard,
        };
        // One standard rule for every standard seller (a tier), roomy for
        // the busiest of them.
        let busiest_standard = (0..sellers)
            .filter(|k| role(*k) == Role::Standard)
            .map(|k| demand[k])
            .fold(rate / sellers.max(1) as f64, f64::max);
        let standard = standard_rule(busiest_standard);
        let stub_window = Duration::from_secs(
            (load_time / 3)
                .clamp(STUB_WINDOW_MIN, STUB_WINDOW_MAX)
                .as_secs(),
        );
        let sellers = (0..sellers)
            .map(|k| {
                let d = demand[k];
                let (rule, tier, stub_throttle) = match role(k) {
                    Role::Bulk => {
                        let limit = d * HELD_SHARE;
                        (
                            rule("token_bucket", limit, Some(2.0 * limit)),
                            Some("bulk"),
                            None,
                        )
                    }
                    Role::LimitBound => {
                        (rule("sliding_window_log", d * HELD_SHARE, None), None, None)
                    }
                    Role::Tight => (rule("gcra", d * HELD_SHARE, Some(2.0)), None, None),
                    Role::Downstream429 => {
                        let throttle = Throttle {
                            seller: crate::dev::load::seller_id(k),
                            // The stub lets 80 % of its demand through: the
                            // worker's own rule would let it all pass.
                            limit: ((d * 0.8 * stub_window.as_secs_f64()).round() as u64).max(1),
                            period: stub_window,
                        };
                        (rule("gcra", d * ROOMY, Some(d)), None, Some(throttle))
                    }
                    Role::Standard => (standard.clone(), Some("standard"), None),
                };
                SellerPlan {
                    id: crate::dev::load::seller_id(k),
                    role: role(k),
                    demand: d,
                    rule,
                    tier,
                    stub_throttle,
                }
            })
            .collect();
        Plan {
            sellers,
            rate,
            load_time,
            jobs: (rate * load_time.as_secs_f64()).round() as u64,
            partitions: (2 * replicas as i32).max(6),
        }
    }

    /// The stub's throttles (its 429 seller).
    pub fn stub_throttles(&self) -> Vec<Throttle> {
        self.sellers
            .iter()
            .filter_map(|s| s.stub_throttle.clone())
            .collect()
    }

    fn bulk_rule(&self) -> Option<&RuleConfig> {
        self.sellers
            .iter()
            .find(|s| s.tier == Some("bulk"))
            .map(|s| &s.rule)
    }

    /// The config of one replica. Topic names stay the defaults (the
    /// demo's broker is its own); everything else that differs from the
    /// defaults is here, with why.
    pub fn worker_toml(&self, w: &WorkerSite) -> String {
        let standard = self
            .sellers
            .iter()
            .find(|s| s.tier == Some("standard"))
            .map_or_else(|| standard_rule(self.rate), |s| s.rule.clone());
        let mut t = String::new();
        t.push_str("# Written by `throttle-worker demo` for one replica; removed at the end.\n");
        t.push_str("[kafka]\n");
        t.push_str(&format!("brokers = {}\n", quote(&w.brokers)));
        t.push_str(&format!("group_id = {}\n", quote(&w.group)));
        t.push_str("commit_interval = \"500ms\"\n");
        t.push_str("[kafka.consumer_properties]\n");
        t.push_str(
            "# The mock broker holds every rebalance for session.timeout.ms - 1 s:\n\
             # short, so that the replicas form their group in seconds.\n",
        );
        t.push_str("\"session.timeout.ms\" = \"3000\"\n\"heartbeat.interval.ms\" = \"300\"\n");
        t.push_str("# Lag metrics every second (default 5 s) for the live view and the drain.\n");
        t.push_str("\"statistics.interval.ms\" = \"1000\"\n");
        t.push_str("[redis]\n");
        t.push_str(&format!("url = {}\n", quote(&w.redis_url)));
        t.push_str(&format!("key_prefix = {}\n", quote(&w.key_prefix)));
        t.push_str("[downstream]\n");
        t.push_str(&format!("url = {}\n", quote(&w.downstream_url)));
        t.push_str("timeout = \"5s\"\nconcurrency = 32\n");
        t.push_str("backoff_base = \"100ms\"\nbackoff_max = \"2s\"\n");
        t.push_str("[http]\n");
        t.push_str(&format!("listen = {}\n", quote(&w.listen.to_string())));
        t.push_str("[worker]\n");
        t.push_str(
            "# The stub's 429s ask for seconds: longer than this, so the\n\
             # throttled seller's jobs go round the retry tiers.\n",
        );
        t.push_str(&format!("max_inline_delay = {}\n", quote(MAX_INLINE_DELAY)));
        t.push_str("shutdown_timeout = \"5s\"\n");
        t.push_str("[limits]\n");
        t.push_str(&format!("default = [{}]\n", inline_rule(&standard)));
        t.push_str("[limits.tiers]\n");
        t.push_str(&format!("standard = [{}]\n", inline_rule(&standard)));
        if let Some(bulk) = self.bulk_rule() {
            t.push_str(&format!("bulk = [{}]\n", inline_rule(bulk)));
        }
        t.push_str("# Every demo seller is named, so each gets metrics of its own.\n");
        t.push_str("[limits.sellers]\n");
        for s in &self.sellers {
            let what = match s.tier {
                Some(tier) => format!("tier = {}", quote(tier)),
                None => format!("rules = [{}]", inline_rule(&s.rule)),
            };
            t.push_str(&format!("{} = {{ {what} }}\n", quote(&s.id)));
        }
        t
    }
}

fn standard_rule(demand: f64) -> RuleConfig {
    rule("sliding_window_log", demand * ROOMY, None)
}

/// Where one replica runs: what differs between the replicas and runs.
#[derive(Debug, Clone)]
pub struct WorkerSite {
    pub brokers: String,
    pub group: String,
    pub redis_url: String,
    pub key_prefix: String,
    pub downstream_url: String,
    pub listen: std::net::SocketAddr,
}

/// A TOML basic string. A JSON string is one (TOML's escapes are JSON's,
/// `\uXXXX` included), and serde_json writes it correctly for any input,
/// such as a Redis URL with a quote in its password.
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

fn inline_rule(r: &RuleConfig) -> String {
    let mut s = format!(
        "{{ algorithm = {}, limit = {}, period = {}",
        quote(&r.algorithm),
        r.limit,
        quote(&humantime::format_duration(r.period).to_string())
    );
    if let Some(b) = r.burst {
        s.push_str(&format!(", burst = {b}"));
    }
    s.push_str(" }");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Policy;

    fn site() -> WorkerSite {
        WorkerSite {
            brokers: "127.0.0.1:1".into(),
            group: "g".into(),
            redis_url: "redis://u:p\"w@127.0.0.1:6379".into(),
            key_prefix: "demo-x".into(),
            downstream_url: "http://127.0.0.1:2/registrations".into(),
            listen: "127.0.0.1:3".parse().unwrap(),
        }
    }

    #[test]
    fn twelve_sellers_at_300_get_every_role_and_scaled_rules() {
        let plan = Plan::new(300.0, 12, Duration::from_secs(30), 3);
        assert_eq!(plan.jobs, 9000);
        assert_eq!(plan.partitions, 6);
        let roles: Vec<Role> = plan.sellers.iter().map(|s| s.role).collect();
        assert_eq!(roles[0], Role::Bulk);
        assert_eq!(roles[1], Role::LimitBound);
        assert_eq!(roles[2], Role::Downstream429);
        assert_eq!(roles[11], Role::Tight);
        assert!(roles[3..11].iter().all(|r| *r == Role::Standard));
        let total: f64 = plan.sellers.iter().map(|s| s.demand).sum();
        assert!((total - 297.0).abs() < 1e-6, "{total}");
        for s in &plan.sellers {
            let ratio = s.limit_per_sec() / s.demand;
            match s.role {
                // Held below what they send (rounding moves it a little).
                Role::Bulk | Role::LimitBound | Role::Tight => {
                    assert!((0.6..0.9).contains(&ratio), "{}: {ratio}", s.id)
                }
                // Room to spare.
                Role::Standard | Role::Downstream429 => {
                    assert!(ratio >= 1.9, "{}: {ratio}", s.id)
                }
            }
        }
        let throttle = plan.stub_throttles();
        assert_eq!(throttle.len(), 1);
        assert_eq!(throttle[0].seller, "seller-2");
        // 80 % of its ~31.9/s over 10 s (a third of the load).
        assert_eq!(throttle[0].period, Duration::from_secs(10));
        assert_eq!(throttle[0].limit, 255);
        let short = Plan::new(100.0, 4, Duration::from_secs(8), 2).stub_throttles();
        assert_eq!(short[0].period, Duration::from_secs(5), "at least 5 s");
    }

    #[test]
    fn few_sellers_keep_the_roles_that_fit() {
        let roles = |n| {
            Plan::new(100.0, n, Duration::from_secs(10), 2)
                .sellers
                .iter()
                .map(|s| s.role)
                .collect::<Vec<_>>()
        };
        assert_eq!(roles(1), vec![Role::Bulk]);
        assert_eq!(roles(2), vec![Role::Bulk, Role::LimitBound]);
        assert_eq!(roles(3), vec![Role::Bulk, Role::LimitBound, Role::Tight]);
        assert_eq!(
            roles(4),
            vec![
                Role::Bulk,
                Role::LimitBound,
                Role::Downstream429,
                Role::Tight
            ]
        );
    }

    #[test]
    fn the_config_loads_and_names_every_seller_with_its_rule() {
        let plan = Plan::new(300.0, 12, Duration::from_secs(30), 3);
        let text = plan.worker_toml(&site());
        let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        let loaded = crate::config::load_from(Some(f.path()), Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(loaded.settings.redis.url, site().redis_url, "quoted intact");
        assert_eq!(loaded.settings.http.listen, site().listen);
        assert_eq!(
            loaded.settings.kafka.consumer_properties["session.timeout.ms"],
            "3000"
        );
        let policy = Policy::load(&loaded).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let named: Vec<&str> = policy.named_sellers().collect();
        assert_eq!(named.len(), 12, "{named:?}");
        for s in &plan.sellers {
            assert_eq!(
                loaded.settings.limits.sellers[&s.id].rules.is_some(),
                s.tier.is_none(),
                "{}",
                s.id
            );
            let rules = match s.tier {
                Some(tier) => loaded.settings.limits.tiers[tier].clone(),
                None => loaded.settings.limits.sellers[&s.id].rules.clone().unwrap(),
            };
            assert_eq!(rules, vec![s.rule.clone()], "{}", s.id);
        }
    }

    #[test]
    fn rules_read_as_the_summary_shows_them() {
        let r = rule("token_bucket", 72.4, Some(144.8));
        assert_eq!(describe(&r), "token_bucket 72/1s burst 145");
        assert_eq!(describe(&rule("gcra", 0.2, None)), "gcra 1/1s");
    }
}
