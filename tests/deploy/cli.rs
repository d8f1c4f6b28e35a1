//! A container's command line, parsed with the binary's own clap
//! definitions (`throttle_worker::cli::Cli`), as the entrypoint would.

use clap::Parser;
use throttle_worker::cli::{Cli, Command};

/// What a command line asks the binary for, as far as the checks care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The subcommand, as typed (`run`, `stub`, `produce`, ...).
    pub subcommand: String,
    /// `run --config FILE`.
    pub config: Option<String>,
}

/// Parses `argv` (the program name first). `Err` carries clap's message.
pub fn parse(argv: &[String]) -> Result<Parsed, String> {
    match Cli::try_parse_from(argv) {
        Ok(cli) => Ok(Parsed {
            subcommand: argv[1].clone(),
            config: match cli.command {
                Command::Run { config } => config.map(|p| p.display().to_string()),
                _ => None,
            },
        }),
        Err(e)
            if e.kind() == clap::error::ErrorKind::InvalidSubcommand
                && argv.get(1).is_some_and(|a| a == "stub") =>
        {
            pending_stub(argv)
        }
        Err(e) => Err(e.render().to_string()),
    }
}

/// TODO(lead): drop once the `stub` subcommand lands on main (another
/// engineer is adding it): until then a `stub` command line is checked
/// against its agreed interface, `throttle-worker stub --listen ADDR
/// [--throttle SELLER=N/PERIOD ...] [--latency DURATION]`. Reached only
/// while the real CLI does not know `stub` at all; once it does, the real
/// definitions decide and a bad flag fails there.
fn pending_stub(argv: &[String]) -> Result<Parsed, String> {
    #[derive(Parser)]
    struct Stub {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        throttle: Vec<String>,
        #[arg(long)]
        latency: Option<String>,
    }
    let stub = Stub::try_parse_from(argv.iter().skip(1)).map_err(|e| e.render().to_string())?;
    for t in &stub.throttle {
        let ok = t
            .split_once('=')
            .and_then(|(_, rate)| rate.split_once('/'))
            .is_some_and(|(n, period)| {
                n.parse::<u64>().is_ok() && humantime::parse_duration(period).is_ok()
            });
        if !ok {
            return Err(format!("--throttle {t}: expected SELLER=N/PERIOD"));
        }
    }
    if let Some(l) = &stub.latency {
        humantime::parse_duration(l).map_err(|e| format!("--latency {l}: {e}"))?;
    }
    let _ = stub.listen;
    Ok(Parsed {
        subcommand: "stub".into(),
        config: None,
    })
}

/// The value of `--flag VALUE` or `--flag=VALUE` in `argv`.
pub fn flag(argv: &[String], name: &str) -> Option<String> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&format!("{name}=")).map(str::to_owned)
        }
    })
}

/// The argv a container runs: the entrypoint (unless replaced) and the
/// command, as Docker and Kubernetes put them together.
pub fn argv(entrypoint: &[String], command: &[String]) -> Vec<String> {
    entrypoint.iter().chain(command).cloned().collect()
}
