//! The limiter against a real Redis: the Lua scripts, their agreement with the Rust models and with the simulation's embedded Redis, edits, cancels, layouts.

mod agreement;
mod cancel;
mod coalesce;
mod cost;
mod edits;
mod embedded;
mod in_flight;
mod isolation;
mod jobs;
mod learn;
mod noscript;
mod oracles;
mod overrides;
mod redis;
mod refund;
mod reset;
mod restore;
mod shadow;
mod short_reply;
mod tables;
