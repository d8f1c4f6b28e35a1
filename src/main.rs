//! The `throttle-worker` binary: parses the command line, sets up logging
//! and hands over to the library; and maps how it ended to one of the exit
//! codes of [`ExitCode`] (clap's usage errors exit 2 on their own).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use throttle_worker::cli::{Cli, Command, Common, DlqCommand, DlqSelect, LimitsCommand};
#[cfg(feature = "dev-tools")]
use throttle_worker::dev::{demo, load, stub};
#[cfg(feature = "dev-tools")]
use throttle_worker::kafka;
use throttle_worker::limiter::Mode;
use throttle_worker::operator::{self, confirm_here, Declined, ExitCode, Output};
use throttle_worker::{config, telemetry, worker};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::Failed.into();
        }
    };
    match runtime.block_on(command(cli.command)) {
        Ok(()) => ExitCode::Success.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e).into()
        }
    }
}

/// The exit code of a failed command: the first typed error in its chain
/// that has a code of its own decides; anything else failed at run time.
fn exit_code(e: &anyhow::Error) -> ExitCode {
    for cause in e.chain() {
        if cause.is::<config::ConfigError>() {
            return ExitCode::Config;
        }
        if cause.is::<Declined>() {
            return ExitCode::Declined;
        }
        #[cfg(feature = "dev-tools")]
        if let Some(demo::DemoError::ChecksFailed(_)) = cause.downcast_ref() {
            return ExitCode::CheckFailed;
        }
    }
    ExitCode::Failed
}

async fn command(command: Command) -> anyhow::Result<()> {
    telemetry::init();
    match command {
        Command::Run { config } => {
            let (settings, policy, deprecations) = load_noting(config.clone())?;
            // Once per renamed key, at startup.
            for d in &deprecations {
                tracing::warn!(old = %d.old, new = %d.new, source = %d.source, "{d}");
            }
            let summary = worker::run_watching(settings, policy, config, shutdown_signal()).await?;
            if summary.abandoned > 0 {
                tracing::warn!(
                    abandoned = summary.abandoned,
                    "in-flight work abandoned at shutdown; it will be redelivered"
                );
            }
            // Exit now, not when the runtime is dropped: a close of the
            // Kafka clients that outlived its timeout (a broker that went
            // away as the worker stopped) still runs on a blocking thread,
            // and dropping the runtime waits for it without end. Seen in
            // scripts/incident-demo.sh: "worker stopped" logged, the
            // process alive an hour later.
            std::process::exit(0)
        }
        #[cfg(feature = "dev-tools")]
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
        Command::Limits { command } => limits(command).await,
        Command::Dlq { command } => dlq(command).await,
        #[cfg(feature = "dev-tools")]
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
            let brokers = brokers.unwrap_or_else(|| k.brokers.clone());
            let topic = topic.unwrap_or_else(|| k.topic.clone());
            let sink = kafka::RecordSink::new(&brokers, &loaded.settings.producer_config())
                .context("kafka producer")?;
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
        #[cfg(feature = "dev-tools")]
        Command::Demo(args) => Ok(demo::run(args, shutdown_signal()).await?),
        #[cfg(feature = "dev-tools")]
        Command::Stub(args) => Ok(stub::serve(args, shutdown_signal()).await?),
        #[cfg(feature = "dev-tools")]
        Command::LimiterDemo { redis_url } => Ok(demo::limiter_demo(&redis_url).await?),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "throttle-worker", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            println!("man pages written to {}", dir.display());
            Ok(())
        }
        Command::CheckConfig { config, json } => {
            let out = if json { Output::Json } else { Output::Table };
            print!("{}", operator::check_config(config.as_deref(), out)?);
            Ok(())
        }
    }
}

/// `dlq stats|show` read the dead-letter topic on a blocking thread;
/// `dlq replay` runs on the async threads (it reads on one of its own).
async fn dlq(command: DlqCommand) -> anyhow::Result<()> {
    use throttle_worker::dlq::{self as dead, TerminalProgress};
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let select = match &command {
        DlqCommand::Replay { select, .. }
        | DlqCommand::Stats { select, .. }
        | DlqCommand::Show { select, .. } => select,
    };
    for warning in select.deprecations() {
        eprintln!("{warning}");
    }
    let open = move |common: &Common, select: &DlqSelect| -> anyhow::Result<_> {
        let (settings, _) = load(common.config.clone())?;
        let filter = select.filter(now_ms)?;
        Ok((
            settings.kafka,
            filter,
            TerminalProgress::new("reading dead letters"),
        ))
    };
    let blocking = |f: Box<dyn FnOnce() -> anyhow::Result<()> + Send>| async move {
        tokio::task::spawn_blocking(f).await?
    };
    match command {
        DlqCommand::Replay {
            dry_run,
            confirm,
            again,
            rate,
            in_flight,
            select,
            common,
        } => {
            let opts = dead::ReplayOptions {
                dry_run,
                again,
                rate,
                in_flight,
                output: common.output(),
            };
            dlq_replay(opts, confirm.yes, &select, &common, now_ms).await
        }
        DlqCommand::Stats {
            top,
            select,
            common,
        } => {
            blocking(Box::new(move || {
                let (kafka, filter, mut progress) = open(&common, &select)?;
                let out = common.output();
                let text = dead::stats(&kafka, &filter, top, out, now_ms, &mut progress)?;
                print!("{text}");
                Ok(())
            }))
            .await
        }
        DlqCommand::Show {
            payload,
            select,
            common,
        } => {
            blocking(Box::new(move || {
                let (kafka, filter, mut progress) = open(&common, &select)?;
                let stdout = std::io::stdout();
                let out = common.output();
                let n = dead::show(
                    &kafka,
                    &filter,
                    payload,
                    out,
                    &mut progress,
                    &mut stdout.lock(),
                )?;
                if out == Output::Table {
                    eprintln!("{n} dead letters matched");
                }
                Ok(())
            }))
            .await
        }
    }
}

/// `dlq replay`: async (Redis markers, acknowledged writes); the topic is
/// read on a blocking thread inside.
async fn dlq_replay(
    opts: throttle_worker::dlq::ReplayOptions,
    yes: bool,
    select: &DlqSelect,
    common: &Common,
    now_ms: i64,
) -> anyhow::Result<()> {
    use throttle_worker::dlq::{self as dead, TerminalProgress};
    // --rate and --in-flight are checked by clap (src/cli.rs).
    let dry_run = opts.dry_run;
    let (settings, _) = load(common.config.clone())?;
    let filter = select.filter(now_ms)?;
    // Every kind, poison records too: a replay of those fails again and
    // floods the dead-letter topic, so it is confirmed first.
    if select.every_kind() && !dry_run {
        let action = format!(
            "dlq replay: writes the matching dead letters of every kind (poison records such as not_json too) from {} back to {}",
            settings.kafka.dlq_topic, settings.kafka.topic
        );
        confirm_here(&action, yes)?;
    }
    let progress = TerminalProgress::new("replaying dead letters");
    let mut stdout = std::io::stdout();
    let done = dead::replay(&settings, &filter, &opts, progress, &mut stdout).await?;
    match common.output() {
        Output::Table => print!("{}", done.text(&settings.kafka.topic, dry_run)),
        Output::Json => println!("{}", serde_json::to_string(&done)?),
    }
    Ok(())
}

async fn limits(command: LimitsCommand) -> anyhow::Result<()> {
    let text = match command {
        LimitsCommand::Show { seller, common } => {
            operator::show(common.config.as_deref(), &seller, common.output()).await?
        }
        LimitsCommand::Reset {
            seller,
            dry_run,
            confirm,
            common,
        } => {
            let file = common.config.as_deref();
            if !dry_run {
                // A bad config is exit 3 before anyone is asked.
                load(common.config.clone())?;
                let action = format!(
                    "limits reset {seller}: clears {seller}'s limiter state and 429 block on every replica"
                );
                confirm_here(&action, confirm.yes)?;
            }
            operator::reset(file, &seller, dry_run, common.output()).await?
        }
        LimitsCommand::Override {
            seller,
            clear: true,
            common,
            ..
        } => operator::clear_override(common.config.as_deref(), &seller, common.output()).await?,
        LimitsCommand::Override {
            seller,
            rule,
            for_,
            until,
            common,
            ..
        } => {
            let end = operator::end(for_.as_deref(), until.as_deref())?;
            let rule = rule.context("--rule")?;
            operator::set_override(
                common.config.as_deref(),
                &seller,
                &rule,
                end,
                common.output(),
            )
            .await?
        }
        LimitsCommand::Pause {
            seller,
            all: _,
            for_,
            until,
            reason,
            dry_run,
            confirm,
            common,
        } => {
            let end = match (&for_, &until) {
                (None, None) => None,
                _ => Some(operator::end(for_.as_deref(), until.as_deref())?),
            };
            if seller.is_none() && !dry_run {
                load(common.config.clone())?;
                let how_long = match (&for_, &until) {
                    (Some(d), _) => format!("for {d}"),
                    (None, Some(t)) => format!("until {t}"),
                    (None, None) => "until `limits resume --all`".to_owned(),
                };
                let action = format!(
                    "limits pause --all: stops every replica's downstream calls for every seller, {how_long}"
                );
                confirm_here(&action, confirm.yes)?;
            }
            operator::pause(
                common.config.as_deref(),
                seller.as_deref(),
                end,
                &reason,
                dry_run,
                common.output(),
            )
            .await?
        }
        LimitsCommand::Resume {
            seller,
            all: _,
            common,
        } => operator::resume(common.config.as_deref(), seller.as_deref(), common.output()).await?,
        LimitsCommand::List { common } => {
            operator::list(common.config.as_deref(), common.output()).await?
        }
        LimitsCommand::Peek {
            seller,
            cost,
            up_to,
            common,
        } => {
            let mode = if up_to {
                Mode::UpTo
            } else {
                Mode::AllOrNothing
            };
            operator::peek(
                common.config.as_deref(),
                &seller,
                cost,
                mode,
                common.output(),
            )
            .await?
        }
    };
    print!("{text}");
    Ok(())
}

fn load(
    file: Option<PathBuf>,
) -> anyhow::Result<(config::Settings, throttle_worker::limiter::Policy)> {
    let (settings, policy, _) = load_noting(file)?;
    Ok((settings, policy))
}

/// [`load`], with the deprecated config keys it found.
fn load_noting(
    file: Option<PathBuf>,
) -> anyhow::Result<(
    config::Settings,
    throttle_worker::limiter::Policy,
    Vec<config::Deprecation>,
)> {
    Ok(operator::load_noting(file.as_deref())?)
}

/// Resolves on SIGTERM or Ctrl-C.
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
