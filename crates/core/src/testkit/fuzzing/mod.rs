//! The bodies of the `controller` and `config` fuzz targets (`fuzz/fuzz_targets/`,
//! nightly), shared with their stable drivers (`crates/core/tests/fuzz_controller.rs`,
//! `fuzz_config.rs`). The first is a hostile or broken switch against the controller
//! core; the second, any text as a configuration
//! ([`config_target`](crate::testkit::fuzzing::config_target)).
//!
//! The codec's own targets (`ofp::fuzzing`) stop at "decodes or is refused". What a
//! switch sends that *does* decode then reaches the core, which must not panic on any of
//! it either, whatever order it comes in: a FLOW_REMOVED for a rule it never installed, a
//! flow-stats reply with another controller's rules, a SYN from a port that does not
//! exist, a frame cut short inside its TCP header, a switch that leaves mid-connection.
//! The input is a program: each step a switch message (raw bytes, or a near-valid one
//! built from what the controller has installed and then mutated), a timer tick, a switch
//! leaving or joining, or a backend figure (probe, metrics text, the runtime's work sample).
//!
//! Every message the core emits must encode, and every rule, group and meter it sends must
//! be one the switch (a [`FakeTable`], which refuses what Open vSwitch refuses) accepts:
//! a controller that a switch's messages can drive into sending invalid rules is as broken
//! as one that panics.

mod configs;
mod input;
mod program;
mod world;

use std::sync::OnceLock;
use std::time::Duration;

pub use configs::CONFIGS;
use input::Input;
pub use program::{Endpoint, HostFrame, Program, seed_programs};
use world::World;

use crate::Config;
use crate::service::BackendId;

/// Switches 1..=SWITCHES, each with ports 1..=PORTS, in a line: port 5 of switch 1 to
/// port 5 of switch 2, port 6 of switch 2 to port 6 of switch 3.
pub(super) const SWITCHES: u64 = 3;
pub(super) const PORTS: u32 = 6;
const LINKS: [((u64, u32), (u64, u32)); 2] = [((1, 5), (2, 5)), ((2, 6), (3, 6))];

pub(super) fn link_peer(dpid: u64, port: u32) -> Option<(u64, u32)> {
    LINKS.iter().find_map(|&(a, b)| match () {
        _ if a == (dpid, port) => Some(b),
        _ if b == (dpid, port) => Some(a),
        _ => None,
    })
}

/// Steps one input may run: bounds the time an input takes, not what it can reach.
const MAX_STEPS: usize = 256;

/// How deep one program went: what the stable driver checks its random programs reach,
/// so that a driver that never gets past the first checks fails rather than passes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reached {
    /// The most connections the controller held at once.
    pub connections: usize,
    /// FLOW_REMOVEDs the controller took.
    pub rules_ended: u64,
    /// TCP resets it sent (a packet of a connection it does not know).
    pub resets: u64,
    /// Links between switches it discovered.
    pub links: usize,
    /// Reloads it carried out.
    pub reloads: u64,
    /// Operator actions it carried out.
    pub operations: u64,
    /// Conntrack rules (which the fake switches hold without running them) the switches
    /// reported in flow stats, and reported ended.
    pub opaque_reported: u64,
    pub opaque_ended: u64,
}

/// Runs `data` as a program against a fresh controller. Panics on a defect.
pub fn controller_target(data: &[u8]) -> Reached {
    // Parsed once: the TOML parser is not what is under test, and it would be a third of
    // each run's time.
    static PARSED: OnceLock<Vec<Config>> = OnceLock::new();
    let configs = PARSED.get_or_init(|| {
        CONFIGS
            .iter()
            .map(|text| match Config::from_toml(text, &|_| None) {
                Ok(c) => c,
                Err(e) => panic!("the target's own config is invalid: {e}"),
            })
            .collect()
    });
    let mut input = Input(data);
    let config = &configs[usize::from(input.u8()) % configs.len()];
    let mut world = World::new(config, configs);
    let mut reached = Reached::default();
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        world.step(&mut input);
        let c = &world.c;
        assert_counts_are_the_tables(c);
        reached.connections = reached.connections.max(c.connections().len());
        reached.links = reached.links.max(c.topology().links().count());
    }
    reached.rules_ended = world.c.counters().flow_removed;
    reached.resets = world.c.counters().resets_sent;
    reached.reloads = world.reloads;
    reached.operations = world.operations;
    reached.opaque_reported = world.opaque_reported;
    reached.opaque_ended = world.opaque_ended;
    reached
}

/// Each backend's `active_connections` is the number of the table's connections it
/// has: the balancers weigh backends by it, and the API reports it as their share of the
/// table without counting the table.
fn assert_counts_are_the_tables(c: &crate::Controller) {
    let mut counted = std::collections::BTreeMap::<(u16, BackendId), u32>::new();
    for (_, conn) in c.connections().iter() {
        *counted.entry((conn.service, conn.backend)).or_default() += 1;
    }
    // Every number a service gave: a backend of the pool (its `active_connections`), or
    // one that left it (what is left open to it).
    for (si, s) in c.services().iter().enumerate() {
        for id in (0..s.numbers_given()).map(|i| BackendId(i as u16)) {
            let n = counted.remove(&(si as u16, id)).unwrap_or(0);
            let open = s.open_connections(id);
            assert_eq!(
                open,
                Some(n),
                "service {} backend {:?}: counted {open:?} connections, the table holds {n}",
                s.cfg.name,
                s.destination(id)
            );
        }
    }
    assert!(counted.is_empty(), "connections of no backend: {counted:?}");
}

/// The body of the `config` fuzz target: any text as a configuration. A configuration is
/// an operator's file, a reload, or (in the distributed mode) a value read from etcd; none
/// may panic the parser. What it refuses it must explain: at least one error, each with a
/// message. What it accepts must build a controller that takes its switches, a tick,
/// and a reload to itself with its services in reverse order.
pub fn config_target(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Config::from_toml(&text, &|_| None) {
        Ok(mut config) => {
            // A table built for millions of connections is memory the operator asked for
            // (`preallocate_connections`, up to 100M: 6.5 GB), not a fault: here a
            // hundred thousand at most, as a run's memory is bounded.
            let c = &mut config.controller;
            c.preallocate_connections = c.preallocate_connections.min(100_000);
            let mut world = World::new(&config, &[]);
            world.tick(Duration::from_millis(20));
            let mut reversed = config.clone();
            reversed.services.reverse();
            world.reload_to(&reversed);
            world.tick(Duration::from_millis(20));
        }
        Err(errors) => {
            assert!(
                !errors.0.is_empty(),
                "a configuration refused with no reason"
            );
            for e in &errors.0 {
                assert!(
                    !e.message.is_empty(),
                    "an error with no message at {:?}",
                    e.path
                );
            }
        }
    }
}

/// A small deterministic generator (xorshift64*) for the stable drivers of the targets.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}
