//! Config errors that name the file and key, and the config reference against the README.

mod errors;
mod reference;
