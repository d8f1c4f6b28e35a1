//! Test target `deploy`: the deployment files (`deploy::`), config errors
//! and reference (`config::`), the command line (`cli::`), the parsers
//! under random input (`fuzz::`), the source's module graph (`code::`), and
//! the book: its links and the reference pages generated from the code
//! (`docs::`).

mod cli;
mod code;
mod common;
mod config;
#[path = "deploy/mod.rs"]
mod deploy;
mod docs;
mod fuzz;
