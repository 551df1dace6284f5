//! Subcommands other than the controller itself.

pub mod ctl;
pub mod ofp;
pub mod sim;
