//! The shared per-seller limiter.
//!
//! - [`rule`]: a validated rule (algorithm, limit per period, burst).
//! - [`decision`]: the typed answers: granted, denied with a retry-after, never.
//! - [`reply`]: the script's raw reply and its reading as a [`Decision`].
//! - [`model`]: pure-Rust reference models of every script, with an injected clock.

pub mod decision;
pub mod model;
pub mod reply;
pub mod rule;

pub use decision::{CannotPass, Decision, Denied, DeniedBy, Granted, Mode, Pace};
pub use reply::Reply;
pub use rule::{Algorithm, Rule, RuleError};
