//! The confirmation a fleet-wide action needs (`limits reset`, `limits
//! pause --all`, a `dlq replay` of every reason): `--yes`, or "y" typed at
//! a terminal. Off a terminal without `--yes` the answer is no: a script
//! that forgot the flag must not change the whole fleet.

use std::io::{BufRead, IsTerminal, Write};

/// How a fleet-wide action was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// `--yes` was given.
    Flag,
    /// "y" or "yes" was typed at the prompt.
    Answered,
}

/// A fleet-wide action not allowed; `main` exits with
/// [`ExitCode::Declined`](super::ExitCode::Declined).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Declined {
    #[error("{action}: acts on the whole fleet; not on a terminal, so it needs --yes (or try --dry-run first)")]
    NotATerminal { action: String },
    #[error("{action}: not confirmed; nothing changed")]
    Refused { action: String },
}

/// Whether both stdin (the answer) and stderr (the question) are a
/// terminal: a person is there to answer.
pub fn on_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Decides whether `action` goes ahead: `--yes` allows it; on a terminal
/// the question goes to `ask` and one line is read from `answer` ("y" or
/// "yes", any case, allows it; anything else, an empty line or the end of
/// input declines); off a terminal it is declined.
pub fn confirm(
    action: &str,
    yes: bool,
    terminal: bool,
    ask: &mut impl Write,
    answer: &mut impl BufRead,
) -> Result<Confirmed, Declined> {
    if yes {
        return Ok(Confirmed::Flag);
    }
    let action = action.to_owned();
    if !terminal {
        return Err(Declined::NotATerminal { action });
    }
    // A prompt that cannot be written or read is a no.
    if write!(ask, "{action}\nProceed? [y/N] ")
        .and_then(|()| ask.flush())
        .is_err()
    {
        return Err(Declined::Refused { action });
    }
    let mut line = String::new();
    match answer.read_line(&mut line) {
        Ok(_) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
            Ok(Confirmed::Answered)
        }
        _ => Err(Declined::Refused { action }),
    }
}

/// [`confirm`] on this process's terminal (stderr asks, stdin answers).
pub fn confirm_here(action: &str, yes: bool) -> Result<Confirmed, Declined> {
    confirm(
        action,
        yes,
        on_terminal(),
        &mut std::io::stderr(),
        &mut std::io::stdin().lock(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(yes: bool, terminal: bool, input: &str) -> (Result<Confirmed, Declined>, String) {
        let mut asked = Vec::new();
        let r = confirm("reset s1", yes, terminal, &mut asked, &mut input.as_bytes());
        (r, String::from_utf8(asked).unwrap())
    }

    #[test]
    fn the_answers() {
        let refused = Err(Declined::Refused {
            action: "reset s1".into(),
        });
        let not_tty = Err(Declined::NotATerminal {
            action: "reset s1".into(),
        });
        // (row, --yes, terminal, input, result, asked)
        type Row<'a> = (u32, bool, bool, &'a str, Result<Confirmed, Declined>, bool);
        let rows: [Row; 10] = [
            (1, true, false, "", Ok(Confirmed::Flag), false),
            (2, true, true, "n\n", Ok(Confirmed::Flag), false),
            (3, false, true, "y\n", Ok(Confirmed::Answered), true),
            (4, false, true, "YES\n", Ok(Confirmed::Answered), true),
            (5, false, true, " yes \n", Ok(Confirmed::Answered), true),
            (6, false, true, "n\n", refused.clone(), true),
            (7, false, true, "\n", refused.clone(), true),
            (8, false, true, "", refused.clone(), true),
            (9, false, true, "yep\n", refused.clone(), true),
            (10, false, false, "y\n", not_tty.clone(), false),
        ];
        for (row, yes, terminal, input, want, asks) in rows {
            let (got, asked) = ask(yes, terminal, input);
            assert_eq!(got, want, "row {row}: input {input:?}");
            assert_eq!(
                asked.contains("Proceed? [y/N]"),
                asks,
                "row {row}: {asked:?}"
            );
        }
        let e = ask(false, false, "").0.unwrap_err();
        assert!(e.to_string().contains("--yes"), "{e}");
    }
}
