//! The command line of the `throttle-worker` binary, as clap definitions.
//!
//! Kept in the library, not in `main.rs`, so that tests can check a command
//! line (e.g. a `command:` in `docker-compose.yml`) with
//! `Cli::try_parse_from` without running the binary. `main.rs` parses and
//! dispatches; nothing here does any work.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// `throttle-worker <COMMAND>`.
#[derive(Parser)]
#[command(
    version,
    about = "Kafka consumer-side throttling worker with a shared Redis limiter per seller"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Load and validate the configuration, then print every seller rule set.
    CheckConfig {
        /// Merged over config/default.toml; THROTTLE__SECTION__KEY overrides both.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum LimiterCommand {
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

fn parse_topic(spec: &str) -> Result<(String, i32), String> {
    crate::kafka::parse_topic_spec(spec).map_err(|e| e.to_string())
}
