//! The exit codes of every `throttle-worker` command, in one place: `main`
//! maps each outcome to one of these, the top-level `--help` lists them,
//! and the docs are generated from [`ExitCode::ALL`].

/// How a command ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// The command did what was asked.
    Success = 0,
    /// The command failed at run time (Redis, Kafka, I/O): the error and
    /// its cause are printed.
    Failed = 1,
    /// Bad flags or arguments: clap's own usage error, printed with the usage.
    Usage = 2,
    /// The configuration is invalid: the file, the key and the problem are
    /// printed. Any command that loads the config (`run`, `check-config`,
    /// `limits ...`, `dlq ...`).
    Config = 3,
    /// A fleet-wide action was not confirmed: no `--yes` off a terminal,
    /// or an answer other than "y" at the prompt. Nothing was changed.
    Declined = 4,
    /// A check failed: the demo's checks (a limit did not hold, a job was
    /// lost), each one printed.
    CheckFailed = 5,
}

impl ExitCode {
    /// Every code, in order, for `--help` and the docs.
    pub const ALL: [ExitCode; 6] = [
        ExitCode::Success,
        ExitCode::Failed,
        ExitCode::Usage,
        ExitCode::Config,
        ExitCode::Declined,
        ExitCode::CheckFailed,
    ];

    /// The number the process exits with.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// One line for `--help` and the docs.
    pub const fn description(self) -> &'static str {
        match self {
            ExitCode::Success => "success",
            ExitCode::Failed => "the command failed at run time (Redis, Kafka, I/O); the cause is printed",
            ExitCode::Usage => "usage error: bad flags or arguments",
            ExitCode::Config => "the configuration is invalid; the file, the key and the problem are printed",
            ExitCode::Declined => "a fleet-wide action was not confirmed (no --yes off a terminal, or not \"y\" at the prompt); nothing changed",
            ExitCode::CheckFailed => "a check failed (the demo's checks); each failure is printed",
        }
    }

    /// The table the top-level `--help` ends with.
    pub fn help() -> String {
        let mut s = String::from("Exit codes (every command):\n");
        for c in ExitCode::ALL {
            s.push_str(&format!("  {}  {}\n", c.code(), c.description()));
        }
        s
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_their_place_in_the_list() {
        for (i, c) in ExitCode::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(c.code()), i, "{c:?}");
        }
        assert!(ExitCode::help().contains("4  a fleet-wide action"));
    }
}
