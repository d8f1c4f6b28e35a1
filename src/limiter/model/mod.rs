//! Reference models (being written).
