//! flowgate's controller core.
//!
//! A deterministic state machine in the manner of quinn-proto and Faucet's Valve: the
//! runtime feeds it `(now, event)` — a switch connected, a PACKET_IN, a FLOW_REMOVED, a
//! timer tick, a health-probe result, an operator's command — and it returns the OpenFlow
//! messages to send, each addressed to a switch. It never reads a clock or a socket, so
//! tests, the benchmark and the simulator drive it exactly as the controller does.
//!
//! Layout:
//! - [`config`]: the TOML config, read strictly and validated into domain types.
//! - [`controller`]: the state machine ([`Controller`]) and the rules it installs.
//! - [`topology`]: switches, links (LLDP), hosts, shortest paths, the flooding tree.
//! - [`conntrack`]: each connection's decision, kept for its whole life.
//! - [`service`]: a service's backends, their live load and health, its balancer.
//! - [`balance`]: the selection algorithms (round robin to ISSLM) behind one interface.
//! - [`health`]: active checks, outlier ejection and slow start, as state machines.
//! - [`cookie`]: what each installed rule is, so a switch can be resynced.
//! - [`overload`]: gapping of new flows under overload (ACCM), per service and for the
//!   controller itself.
//! - [`metrics_text`]: backends' own Prometheus figures turned into load.

pub mod balance;
pub mod config;
pub mod conntrack;
pub mod controller;
pub mod cookie;
pub mod health;
pub mod metrics_text;
pub mod overload;
pub mod service;
pub mod topology;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use config::Config;
pub use controller::{Controller, Encoded, EncodedFrame, Outbox, RuleEnded};
