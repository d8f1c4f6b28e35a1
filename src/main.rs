//! The `throttle-worker` binary: parses the command line, sets up logging
//! and hands over to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use throttle_worker::cli::{Cli, Command, LimiterCommand};
use throttle_worker::limiter::overrides::{self, Override};
use throttle_worker::limiter::{KeySpace, Limiter, Mode, Policy, RedisStore, Request};
use throttle_worker::{config, demo, kafka, load, telemetry, worker};

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
