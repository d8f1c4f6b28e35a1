//! The source's shape: which module may import what.

mod inner_graph;
mod module_graph;
