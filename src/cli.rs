//! The command line of the `throttle-worker` binary, as clap definitions.
//!
//! Kept in the library, not in `main.rs`, so that tests can check a command
//! line (a `command:` in `docker-compose.yml`, a Kubernetes container's
//! `args`) with `Cli::try_parse_from` without running the binary. `main.rs`
//! parses and dispatches; nothing here does any work.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::dead_letter::DeadLetterKind;
use crate::operator::{ExitCode, Output};

#[derive(Parser)]
#[command(
    version,
    about = "Kafka consumer-side throttling worker with a shared Redis limiter per seller",
    after_long_help = ExitCode::help()
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
    #[cfg(feature = "dev-tools")]
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
    /// Operator tools for the limits: show a seller's live state, reset it,
    /// override its rule for a while, list overrides, dry runs.
    #[command(alias = "limiter")]
    Limits {
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// The dead-letter topic: count its records by reason, seller and age,
    /// list them, or replay them. Reads outside the workers' consumer group.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    #[cfg(feature = "dev-tools")]
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
        #[arg(long, default_value_t = 1.0, value_parser = at_least_zero)]
        skew: f64,
        /// Jobs per second; 0 as fast as the broker takes them.
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Share of malformed records, 0 to 1.
        #[arg(long, default_value_t = 0.0, value_parser = share)]
        malformed: f64,
        /// Bytes of filler in each payload.
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
    },
    #[cfg(feature = "dev-tools")]
    /// The whole pipeline on one machine with only Redis: mock broker,
    /// worker replicas, a downstream stub, a skewed load, a live view, and
    /// a summary that checks every limit held and no job was lost.
    Demo(crate::dev::demo::DemoArgs),
    #[cfg(feature = "dev-tools")]
    /// A downstream stub: POST /registrations counts per seller (429 past
    /// --throttle), GET /stats and /jobs report.
    Stub(crate::dev::stub::StubArgs),
    #[cfg(feature = "dev-tools")]
    /// Live run of every algorithm against Redis: grants, refusals,
    /// retry-after (was `limits demo`).
    LimiterDemo {
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
    },
    /// Shell completions for bash, zsh, fish, elvish or powershell, written
    /// to stdout: e.g. `throttle-worker completions bash >
    /// /etc/bash_completion.d/throttle-worker`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Man pages, one per command (`throttle-worker.1`,
    /// `throttle-worker-limits-show.1`, ...), written into DIR.
    Man {
        /// Created if missing; e.g. /usr/local/share/man/man1.
        dir: PathBuf,
    },
    /// Load and validate the configuration, then print the rules of every
    /// tier and named seller; exits non-zero with file, key and problem.
    CheckConfig {
        /// Merged over config/default.toml; THROTTLE__SECTION__KEY overrides both.
        #[arg(long)]
        config: Option<PathBuf>,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Flags every `limits` command takes.
#[derive(clap::Args)]
pub struct Common {
    /// Merged over config/default.toml; THROTTLE__SECTION__KEY overrides both.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// JSON for scripts instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

impl Common {
    pub fn output(&self) -> Output {
        if self.json {
            Output::Json
        } else {
            Output::Table
        }
    }
}

#[derive(Subcommand)]
pub enum LimitsCommand {
    /// The rules that apply to a seller, any override, and each rule's live
    /// state (remaining, retry-after, time until full), charging nothing.
    Show {
        seller: String,
        #[command(flatten)]
        common: Common,
    },
    /// Clears one seller's limiter state and any 429 block, on every
    /// replica at once (the state lives in Redis): its next job starts
    /// with a full allowance. Asks first on a terminal; elsewhere needs --yes.
    Reset {
        seller: String,
        /// List the keys it would clear and which hold state; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Gives one seller a temporary rule in place of its configured ones,
    /// on every replica within a second, until it expires (or `--clear`).
    Override {
        seller: String,
        /// ALGORITHM:LIMIT/PERIOD[:BURST], e.g. gcra:500/1m or token_bucket:600/1m:50.
        #[arg(long, required_unless_present = "clear")]
        rule: Option<String>,
        /// How long it lasts, e.g. 2h (or give --until).
        #[arg(long = "for", conflicts_with = "until")]
        for_: Option<String>,
        /// When it ends, RFC 3339 UTC, e.g. 2026-11-23T18:00:00Z.
        #[arg(long)]
        until: Option<String>,
        /// Remove the seller's override instead.
        #[arg(long, conflicts_with_all = ["rule", "for_", "until"])]
        clear: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Stops every replica's downstream calls for one seller (or, with
    /// `--all`, for every seller) within a second, until `limits resume`
    /// or the end given. Its jobs wait, in memory, then in the retry tiers:
    /// none is dead-lettered, none is lost. `--all` asks first on a
    /// terminal; elsewhere it needs --yes.
    Pause {
        /// The seller to pause (or give --all).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        seller: Option<String>,
        /// Pause every seller: a maintenance window of the downstream.
        #[arg(long)]
        all: bool,
        /// How long it lasts, e.g. 30m (or give --until; neither: until resumed).
        #[arg(long = "for", conflicts_with = "until")]
        for_: Option<String>,
        /// When it ends, RFC 3339 UTC, e.g. 2026-11-23T03:00:00Z.
        #[arg(long)]
        until: Option<String>,
        /// Why, shown by `limits show` and `limits list` (e.g. an incident id).
        #[arg(long, default_value = "")]
        reason: String,
        /// Print the pause it would write; write nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Ends a pause: the seller's (or, with `--all`, the fleet-wide one)
    /// jobs flow again within a second; those parked in the retry tiers
    /// within a minute.
    Resume {
        /// The seller to resume (or give --all).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        seller: Option<String>,
        /// End the pause of every seller (`limits pause --all`); sellers
        /// paused one by one stay paused.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the overrides and the pauses in force.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Dry run for one seller: what the limiter would answer now for a
    /// cost, charging nothing.
    Peek {
        seller: String,
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// Grant up to `cost` instead of all or nothing.
        #[arg(long)]
        up_to: bool,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Counts of the matching dead letters by reason kind, by seller and by
    /// age, with the oldest and the newest.
    Stats {
        /// How many sellers the table names (the ones with the most).
        #[arg(long, default_value_t = 20)]
        top: usize,
        #[command(flatten)]
        select: DlqSelect,
        #[command(flatten)]
        common: Common,
    },
    /// The matching dead letters, one a line: reason, seller, job id and
    /// where the job first entered.
    Show {
        /// Also print each record's value (the job's payload).
        #[arg(long)]
        payload: bool,
        #[command(flatten)]
        select: DlqSelect,
        #[command(flatten)]
        common: Common,
    },
    /// Writes the matching dead letters back to the jobs topic (key and
    /// value as they were, fresh attempts, `x-replayed-from`), each exactly
    /// once: a replay killed and run again, or run twice, writes no record
    /// twice. Replayed jobs pass the limits like any other. Without
    /// `--kind` (poison records such as not_json too) it asks first on a
    /// terminal; elsewhere it needs --yes.
    Replay {
        /// List what would go; write nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        confirm: Confirm,
        /// Replay records replayed before, too.
        #[arg(long)]
        again: bool,
        /// At most this many records a second (default: as fast as the
        /// broker takes them).
        #[arg(long, value_parser = above_zero)]
        rate: Option<f64>,
        /// At most this many records written and not yet acknowledged at
        /// once; a killed replay leaves at most this many for the next run
        /// to look up in the jobs topic.
        #[arg(long, default_value_t = crate::dlq::replay::DEFAULT_IN_FLIGHT, value_parser = at_least_one)]
        in_flight: usize,
        #[command(flatten)]
        select: DlqSelect,
        #[command(flatten)]
        common: Common,
    },
}

/// `--yes`, which a fleet-wide action needs off a terminal
/// ([`crate::operator::confirm`]).
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Confirm {
    /// Go ahead without asking: this acts on the whole fleet. Needed off a
    /// terminal (scripts, CI); not needed with --dry-run.
    #[arg(long)]
    pub yes: bool,
}

/// Which dead letters a `dlq` command takes.
///
/// `--after` and `--before` bound when a dead letter was written; until
/// this version they were `--since` and `--until`, which elsewhere (`limits
/// pause|override --until`) mean when something ends. `--kind` was
/// `--reason`, which `limits pause --reason` uses for free text. The old
/// names still work, hidden, and [`DlqSelect::deprecations`] says so.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DlqSelect {
    /// Only this dead-letter kind (repeatable), e.g. attempts_exhausted, not_json.
    #[arg(long = "kind", value_enum)]
    pub kinds: Vec<DeadLetterKind>,
    /// Deprecated name of --kind.
    #[arg(long = "reason", value_enum, hide = true)]
    pub reasons: Vec<DeadLetterKind>,
    /// Only this seller's.
    #[arg(long)]
    pub seller: Option<String>,
    /// Only those written at or after: RFC 3339 UTC (2026-11-23T18:00:00Z)
    /// or an age (2h: the last two hours).
    #[arg(long, conflicts_with = "since")]
    pub after: Option<String>,
    /// Only those written before: RFC 3339 UTC or an age (30m: until half
    /// an hour ago).
    #[arg(long, conflicts_with = "until")]
    pub before: Option<String>,
    /// Deprecated name of --after.
    #[arg(long, hide = true)]
    pub since: Option<String>,
    /// Deprecated name of --before.
    #[arg(long, hide = true)]
    pub until: Option<String>,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<usize>,
}

impl DlqSelect {
    /// The dead letters these flags select, ages taken before `now_ms`.
    pub fn filter(&self, now_ms: i64) -> Result<crate::dlq::Filter, crate::dlq::DlqError> {
        let kinds = self.kinds.iter().chain(&self.reasons);
        crate::dlq::Filter::from_args(
            kinds.map(|k| k.name().to_owned()).collect(),
            self.seller.clone(),
            flag("after", &self.after).or(flag("since", &self.since)),
            flag("before", &self.before).or(flag("until", &self.until)),
            self.limit,
            now_ms,
        )
    }

    /// Whether it takes every kind: poison records such as not_json too.
    pub fn every_kind(&self) -> bool {
        self.kinds.is_empty() && self.reasons.is_empty()
    }

    /// A warning for each deprecated flag given, naming the new one.
    pub fn deprecations(&self) -> Vec<String> {
        let old = [
            ("--reason", "--kind", !self.reasons.is_empty()),
            ("--since", "--after", self.since.is_some()),
            ("--until", "--before", self.until.is_some()),
        ];
        old.into_iter()
            .filter(|(_, _, given)| *given)
            .map(|(old, new, _)| {
                format!("warning: dlq {old} is deprecated and will be removed; use {new}")
            })
            .collect()
    }
}

/// A time flag's value with its name, for the error if it does not parse.
fn flag<'a>(name: &'static str, value: &'a Option<String>) -> Option<(&'static str, &'a str)> {
    value.as_deref().map(|v| (name, v))
}

/// `--kind`'s values are the dead-letter kinds, each with its description
/// in `--help`; clap lists them when a wrong one is given.
impl clap::ValueEnum for DeadLetterKind {
    fn value_variants<'a>() -> &'a [Self] {
        &DeadLetterKind::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.description()))
    }
}

// Numbers with a range, checked by clap so that a value out of it is a
// usage error (exit 2) like any other bad flag.

/// A number, for the parsers below.
fn number(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("{s:?} is not a number"))
}

/// A rate: above 0.
fn above_zero(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err(format!("must be above 0, got {x}"))
    }
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a whole number of at least 1, got {s:?}")),
    }
}

#[cfg(feature = "dev-tools")]
/// An exponent: 0 or more.
fn at_least_zero(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("must be at least 0, got {x}"))
    }
}

#[cfg(feature = "dev-tools")]
/// A share: 0 to 1.
fn share(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("must be between 0 and 1, got {x}"))
    }
}

#[cfg(feature = "dev-tools")]
fn parse_topic(spec: &str) -> Result<(String, i32), String> {
    crate::kafka::parse_topic_spec(spec).map_err(|e| e.to_string())
}
