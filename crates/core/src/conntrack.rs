//! The connection table: each client connection's backend, decided once and kept.
//!
//! Rules take effect in Open vSwitch's userspace datapath a little after the switch
//! accepts them, so several packets of a new connection (retransmitted SYNs, the first
//! ACK, the request, the backend's SYN-ACK) can still reach the controller. Each of them
//! must get the same answer as the first, in both directions; so the decision is recorded
//! here and applied to every packet of the connection that comes up, and it is only
//! forgotten when the switch reports the connection's rule gone.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ahash::RandomState;

/// A client connection as the client sees it: to the service address (the VIP, or the
/// backend address the client asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    pub client: Ipv4Addr,
    pub client_port: u16,
    pub service_addr: Ipv4Addr,
    pub service_port: u16,
}

/// What was decided for one connection. Kept small: the table holds one per live
/// connection, and the target is under 200 bytes each including the map's overhead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    pub service: u16,
    pub backend: u16,
    /// When the decision was made, in controller-relative milliseconds.
    pub created_ms: u64,
    /// Whether the rules for it have been sent (false while the path is still unknown).
    pub installed: bool,
    /// What the controller itself saw of the backend's side (packets that reached it
    /// while the rules settled), for passive outlier detection.
    pub reply: Reply,
}

/// The backend's side of a connection, as far as the controller saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reply {
    /// Nothing came up to the controller (normal once the reverse rule is in).
    #[default]
    Unseen,
    /// The backend answered.
    Answered,
    /// The backend answered with a RST (already counted as a failure).
    Reset,
}

/// Live connections, keyed as the client sees them.
#[derive(Debug, Default)]
pub struct ConnTable {
    map: HashMap<ConnKey, Conn, RandomState>,
}

impl ConnTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        ConnTable {
            map: HashMap::with_capacity_and_hasher(n, RandomState::new()),
        }
    }

    pub fn get(&self, key: &ConnKey) -> Option<&Conn> {
        self.map.get(key)
    }

    pub fn get_mut(&mut self, key: &ConnKey) -> Option<&mut Conn> {
        self.map.get_mut(key)
    }

    /// Record a decision. Returns the previous one if the key was already there.
    pub fn insert(&mut self, key: ConnKey, conn: Conn) -> Option<Conn> {
        self.map.insert(key, conn)
    }

    pub fn remove(&mut self, key: &ConnKey) -> Option<Conn> {
        self.map.remove(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ConnKey, &Conn)> {
        self.map.iter()
    }

    /// Forget every connection of one service's backend (for instance when it is removed
    /// from the pool and its flows are deleted).
    pub fn retain(&mut self, f: impl FnMut(&ConnKey, &mut Conn) -> bool) {
        self.map.retain(f);
    }
}
