//! Test target `deploy`: the deployment files (`deploy::`), config errors
//! and reference (`config::`), the command line (`cli::`), the parsers
//! under random input (`fuzz::`) and the source's module graph (`code::`).

mod cli;
mod code;
mod common;
mod config;
#[path = "deploy/mod.rs"]
mod deploy;
mod fuzz;
