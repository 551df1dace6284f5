//! flowgate: an OpenFlow 1.3 SDN controller that balances HTTP services at virtual IPs.
//!
//! This crate is the I/O shell around [`flowgate_core`]: the switch sessions and timers
//! ([`runtime`]), the HTTP API and Prometheus endpoint ([`api`]), and the command-line
//! tools ([`cli`]). The one binary, `flowgate`, is in `main.rs`.

pub mod api;
pub mod bench;
pub mod cli;
pub mod runtime;
pub mod server;
