//! The `throttle-worker` binary: parses the command line, sets up logging
//! and hands over to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use throttle_worker::limiter::overrides::{self, Override};
use throttle_worker::limiter::{KeySpace, Limiter, Mode, Policy, RedisStore, Request};
use throttle_worker::{config, demo, kafka, load, stub, telemetry, worker};

#[derive(Parser)]
#[command(
    version,
    about = "Kafka consumer-side throttling worker with a shared Redis limiter per seller"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a worker: consume jobs, ask the limiter, call the downstream.
    Run {
        /// Merged over config/default.toml; THROTTLE__SECTION__KEY overrides both.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Host librdkafka's mock cluster for local runs and multi-process tests.
    /// Prints `bootstrap.servers=<list>` first, then serves until SIGTERM.
    DevBroker {
        /// A topic to create, as NAME:PARTITIONS (repeatable).
        #[arg(long = "topic", value_parser = parse_topic)]
        topics: Vec<(String, i32)>,
        /// Also create every topic the worker's config names (jobs, each
        /// retry tier, dead letters), the first two with this many partitions.
        #[arg(long = "worker-topics", value_name = "PARTITIONS")]
        worker_topics: Option<i32>,
        /// The config whose topics `--worker-topics` creates.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Operator tools for the limiter.
    Limiter {
        #[command(subcommand)]
        command: LimiterCommand,
    },
    /// Load generator: jobs of many sellers with a Zipf skew, a share of
    /// malformed records and a paced rate, written to the jobs topic.
    Produce {
        /// Brokers and jobs topic come from here (and its Kafka properties).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides kafka.brokers.
        #[arg(long)]
        brokers: Option<String>,
        /// Overrides kafka.topic.
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        jobs: u64,
        #[arg(long, default_value_t = 100)]
        sellers: u64,
        /// Zipf exponent over sellers: 0 uniform, 1 a few sellers send most.
        #[arg(long, default_value_t = 1.0)]
        skew: f64,
        /// Jobs per second; 0 as fast as the broker takes them.
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Share of malformed records, 0 to 1.
        #[arg(long, default_value_t = 0.0)]
        malformed: f64,
        /// Bytes of filler in each payload.
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
    },
    /// The whole pipeline on one machine with only Redis: mock broker,
    /// worker replicas, a downstream stub, a skewed load, a live view, and
    /// a summary that checks every limit held and no job was lost.
    Demo(demo::DemoArgs),
    /// A downstream stub: POST /registrations counts per seller (429 past
    /// --throttle), GET /stats and /jobs report.
    Stub(stub::StubArgs),
    /// Load and validate the configuration, then print every seller rule set.
    CheckConfig {
        /// Merged over config/default.toml; THROTTLE__SECTION__KEY overrides both.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum LimiterCommand {
    /// Live run of every algorithm against Redis: grants, refusals, retry-after.
    Demo {
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
    },
    /// Dry run for one seller: what the limiter would answer now, charging nothing.
    Peek {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        seller: String,
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// Grant up to `cost` instead of all or nothing.
        #[arg(long)]
        up_to: bool,
    },
    /// Gives one seller a temporary rule in place of its configured ones,
    /// on every replica within a second, until it expires (or `--clear`).
    Override {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        seller: String,
        /// Remove the seller's override instead.
        #[arg(long)]
        clear: bool,
        #[arg(long, default_value = "gcra")]
        algorithm: String,
        #[arg(long, required_unless_present = "clear")]
        limit: Option<u64>,
        /// e.g. 1m, 1s, 1h.
        #[arg(long, default_value = "1m")]
        period: String,
        #[arg(long)]
        burst: Option<u64>,
        /// How long it lasts, e.g. 2h (or give --until).
        #[arg(long = "for", conflicts_with = "until")]
        for_: Option<String>,
        /// When it ends, RFC 3339 UTC, e.g. 2026-11-23T18:00:00Z.
        #[arg(long)]
        until: Option<String>,
    },
    /// Lists the overrides in force.
    Overrides {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Clears one seller's limiter state and any 429 block, on every
    /// replica at once (the state lives in Redis): its next job starts
    /// with a full allowance.
    Reset {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        seller: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    match Cli::parse().command {
        Command::Run { config } => {
            let (settings, policy) = load(config.clone())?;
            let summary = worker::run_watching(settings, policy, config, shutdown_signal()).await?;
            if summary.abandoned > 0 {
                tracing::warn!(
                    abandoned = summary.abandoned,
                    "in-flight work abandoned at shutdown; it will be redelivered"
                );
            }
            Ok(())
        }
        Command::DevBroker {
            mut topics,
            worker_topics,
            config,
        } => {
            if let Some(partitions) = worker_topics {
                let loaded = throttle_worker::config::load(config.as_deref())?;
                topics.extend(loaded.settings.kafka.topic_specs(partitions));
            }
            kafka::serve_dev_broker(topics, shutdown_signal()).await?;
            Ok(())
        }
        Command::Limiter {
            command: LimiterCommand::Demo { redis_url },
        } => demo::limiter_demo(&redis_url).await,
        Command::Limiter {
            command:
                LimiterCommand::Peek {
                    config,
                    seller,
                    cost,
                    up_to,
                },
        } => {
            let limiter = open_limiter(config).await?;
            let mode = if up_to {
                Mode::UpTo
            } else {
                Mode::AllOrNothing
            };
            let decision = limiter
                .check(Request {
                    dry_run: true,
                    ..Request::new(&seller, cost, mode)
                })
                .await?;
            println!("{decision:#?}");
            Ok(())
        }
        Command::Limiter {
            command: LimiterCommand::Reset { config, seller },
        } => {
            let limiter = open_limiter(config).await?;
            let keys = limiter.seller_keys(&seller);
            let existed = limiter.store().delete(&keys).await?;
            println!(
                "reset {seller}: {existed} of its {} keys held state (rules and 429 block); cleared",
                keys.len()
            );
            Ok(())
        }
        Command::Produce {
            config,
            brokers,
            topic,
            jobs,
            sellers,
            skew,
            rate,
            malformed,
            payload_bytes,
        } => {
            let loaded = config::load(config.as_deref()).context("invalid configuration")?;
            let k = &loaded.settings.kafka;
            anyhow::ensure!(
                (0.0..=1.0).contains(&malformed),
                "--malformed must be between 0 and 1, got {malformed}"
            );
            anyhow::ensure!(skew >= 0.0, "--skew must be at least 0, got {skew}");
            let brokers = brokers.unwrap_or_else(|| k.brokers.clone());
            let topic = topic.unwrap_or_else(|| k.topic.clone());
            let sink =
                kafka::RecordSink::new(&brokers, &k.producer_config()).context("kafka producer")?;
            let spec = load::LoadSpec {
                jobs,
                sellers,
                skew,
                rate,
                malformed,
                payload_bytes,
                run_id: format!("load-{:08x}", rand::random::<u32>()),
            };
            let started = std::time::Instant::now();
            let written = load::run(&sink, &topic, &spec).await?;
            println!(
                "produced {written} jobs ({} ids) for {sellers} sellers to {topic} in {:.1?}",
                spec.run_id,
                started.elapsed()
            );
            Ok(())
        }
        Command::Limiter {
            command:
                LimiterCommand::Override {
                    config,
                    seller,
                    clear,
                    algorithm,
                    limit,
                    period,
                    burst,
                    for_,
                    until,
                },
        } => {
            let (store, key) = open_overrides(config).await?;
            if clear {
                let n = store
                    .clear_overrides(&key, std::slice::from_ref(&seller))
                    .await?;
                println!(
                    "{seller}: {}",
                    if n > 0 {
                        "override cleared"
                    } else {
                        "had no override"
                    }
                );
                return Ok(());
            }
            let now = std::time::SystemTime::now();
            let until = match (for_, until) {
                (Some(d), None) => now + humantime::parse_duration(&d).context("--for")?,
                (None, Some(t)) => humantime::parse_rfc3339_weak(&t).context("--until")?,
                _ => anyhow::bail!("give --for DURATION or --until TIME"),
            };
            let until_ms = until
                .duration_since(std::time::UNIX_EPOCH)
                .context("--until before 1970")?
                .as_millis() as u64;
            anyhow::ensure!(until > now, "the override would end before it starts");
            let o = Override {
                algorithm,
                limit: limit.context("--limit")?,
                period_ms: humantime::parse_duration(&period)
                    .context("--period")?
                    .as_millis() as u64,
                burst,
                until_ms,
            };
            let rule = o
                .rule()
                .map_err(|e| anyhow::anyhow!("invalid override: {e}"))?;
            store.write_override(&key, &seller, &o.to_json()).await?;
            println!(
                "{seller}: {rule} until {} (on every replica within {:?})",
                humantime::format_rfc3339_seconds(until),
                overrides::REFRESH
            );
            Ok(())
        }
        Command::Limiter {
            command: LimiterCommand::Overrides { config },
        } => {
            let (store, key) = open_overrides(config).await?;
            let fields = store.read_overrides(&key).await?;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis() as u64;
            let mut expired = Vec::new();
            let mut rows: Vec<(String, String)> = Vec::new();
            for (seller, json) in &fields {
                match serde_json::from_str::<Override>(json) {
                    Ok(o) if o.until_ms > now_ms => {
                        let rule = o
                            .rule()
                            .map_or_else(|e| format!("invalid: {e}"), |r| r.to_string());
                        let until =
                            std::time::UNIX_EPOCH + std::time::Duration::from_millis(o.until_ms);
                        rows.push((
                            seller.clone(),
                            format!("{rule} until {}", humantime::format_rfc3339_seconds(until)),
                        ));
                    }
                    _ => expired.push(seller.clone()),
                }
            }
            // Expired fields are dropped here, by the operator's tool, not
            // by every worker every second.
            store.clear_overrides(&key, &expired).await?;
            rows.sort();
            if rows.is_empty() {
                println!("no overrides in force");
            }
            for (seller, what) in rows {
                println!("{seller}: {what}");
            }
            Ok(())
        }
        Command::Demo(args) => demo::run(args, shutdown_signal()).await,
        Command::Stub(args) => stub::serve(args, shutdown_signal()).await,
        Command::CheckConfig { config } => {
            let (settings, policy) = load(config)?;
            println!("configuration is valid");
            println!("redis: {:?}", settings.redis);
            println!(
                "global: {:?}",
                policy
                    .global()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            );
            for (tier, rules) in policy.tiers() {
                println!(
                    "tier {tier}: {:?}",
                    rules.iter().map(ToString::to_string).collect::<Vec<_>>()
                );
            }
            for seller in policy.named_sellers() {
                println!("seller {seller}: {:?}", policy.resolve(seller));
            }
            Ok(())
        }
    }
}

fn load(file: Option<PathBuf>) -> anyhow::Result<(config::Settings, Policy)> {
    let loaded = config::load(file.as_deref()).context("invalid configuration")?;
    let policy = Policy::load(&loaded).context("invalid configuration")?;
    Ok((loaded.settings, policy))
}

fn parse_topic(spec: &str) -> Result<(String, i32), String> {
    kafka::parse_topic_spec(spec).map_err(|e| e.to_string())
}

/// Resolves on SIGTERM or Ctrl-C.
/// The limiter as the worker sees it, for the operator commands: the
/// config's policy with the overrides in force now.
async fn open_limiter(config: Option<PathBuf>) -> anyhow::Result<Limiter<RedisStore>> {
    let (settings, policy) = load(config)?;
    let store = RedisStore::open(&settings.redis).await?;
    let limiter = Limiter::new(
        store,
        KeySpace::new(settings.redis.key_prefix.clone()),
        policy,
        settings.redis.topology,
    );
    limiter.refresh_overrides().await?;
    Ok(limiter)
}

/// Redis and the key of the overrides hash, for `limiter override(s)`.
async fn open_overrides(config: Option<PathBuf>) -> anyhow::Result<(RedisStore, String)> {
    let (settings, _) = load(config)?;
    let store = RedisStore::open(&settings.redis).await?;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).overrides();
    Ok((store, key))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}
