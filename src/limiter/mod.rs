//! The shared per-seller limiter.
//!
//! - [`rule`]: a validated rule (algorithm, limit per period, burst).
//! - [`decision`]: the typed answers: granted, denied with a retry-after, never.
//! - [`policy`]: which rules apply to a seller (default, tiers, overrides, unlimited, global).
//! - [`keys`]: Redis key names, one hash tag per seller.
//! - [`model`]: pure-Rust reference models of every script, with an injected clock.
//! - [`redis`]: the only module that talks to Redis; runs `lua/` with EVALSHA.

pub mod decision;
pub mod rule;

pub use decision::{CannotPass, Decision, Denied, DeniedBy, Granted, Mode, Pace};
pub use rule::{Algorithm, Rule, RuleError};
