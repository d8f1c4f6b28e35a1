//! The parsers under random input.

mod parsers;
