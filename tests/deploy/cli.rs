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
        Err(e) => Err(e.render().to_string()),
    }
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
