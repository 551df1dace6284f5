//! Subcommands other than the controller itself.

pub mod ofp;
