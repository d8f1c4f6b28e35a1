//! Test target `sim`: the engine under a deterministic simulation
//! (`sim::engine::`); no network, tokio's paused clock. See `sim/mod.rs`.

#[path = "sim/mod.rs"]
mod sim;
