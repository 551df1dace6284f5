//! The connection table: each client connection's backend, decided once and kept.
//!
//! Rules take effect in Open vSwitch's userspace datapath a little after the switch
//! accepts them, so several packets of a new connection (retransmitted SYNs, the first
//! ACK, the request, the backend's SYN-ACK) can still reach the controller. Each of them
//! must get the same answer as the first, in both directions; so the decision is recorded
//! here and applied to every packet of the connection that comes up, and it is only
//! forgotten when the switch reports the connection's rule gone.

use std::net::Ipv4Addr;

use ahash::RandomState;
use griddle::HashMap;
use griddle::hash_map::RawEntryMut;

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
    /// Whether the rules for it have been sent (false while they wait for the client's
    /// ACK: `controller::handshake`).
    pub installed: bool,
    /// What the controller itself saw of the backend's side (packets that reached it
    /// while the rules settled), for passive outlier detection.
    pub reply: Reply,
    /// The client's initial sequence number, from its SYN: a SYN with the same one is a
    /// retransmission of this connection, a SYN with another is a new connection on the
    /// same 4-tuple (RFC 9293 §3.4.1: each connection picks a fresh ISN). `None` for a
    /// connection rebuilt from a switch's rules, whose SYN was never seen.
    pub isn: Option<u32>,
    /// Tag of this decision in its rules' cookies, so a FLOW_REMOVED of an earlier
    /// connection on the same 4-tuple is told apart from this one's.
    pub tag: u16,
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

/// Shards of the connection table (a power of two).
const SHARDS: usize = 256;

/// Live connections, keyed as the client sees them.
///
/// A hash table that outgrows itself moves every entry to a table twice the size. All at
/// once (hashbrown), that was the PACKET_IN path's longest pause: measured over 5M inserts
/// into 256 shards, ~800 inserts took over 100 µs and ~250 over 500 µs, 17 % of the
/// inserting time, the p99 of setup latency at half the peak rate. So each shard is a
/// `griddle` map, which moves a few entries per insert instead (incremental resizing); the
/// shards keep each new table's allocation, and the zeroing of its control bytes, small.
/// A shard is chosen by bits 40..48 of the same keyed hash the map uses, bits it uses
/// neither for the bucket index (low bits) nor for its tag (top 7 bits).
#[derive(Debug)]
pub struct ConnTable {
    hasher: RandomState,
    shards: Box<[HashMap<ConnKey, Conn, RandomState>]>,
    len: usize,
}

impl Default for ConnTable {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl ConnTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        let per = n.div_ceil(SHARDS);
        let hasher = RandomState::new();
        ConnTable {
            shards: (0..SHARDS)
                .map(|_| HashMap::with_capacity_and_hasher(per, hasher.clone()))
                .collect(),
            hasher,
            len: 0,
        }
    }

    /// The key's hash, computed once per operation, and its shard. Each shard's map was
    /// built with a clone of `hasher`, so the hash is the one it would compute itself.
    #[inline]
    fn locate(&self, key: &ConnKey) -> (u64, usize) {
        let h = self.hasher.hash_one(key);
        (h, ((h >> 40) as usize) & (SHARDS - 1))
    }

    pub fn get(&self, key: &ConnKey) -> Option<&Conn> {
        let (h, s) = self.locate(key);
        self.shards[s]
            .raw_entry()
            .from_key_hashed_nocheck(h, key)
            .map(|(_, c)| c)
    }

    pub fn get_mut(&mut self, key: &ConnKey) -> Option<&mut Conn> {
        let (h, s) = self.locate(key);
        match self.shards[s]
            .raw_entry_mut()
            .from_key_hashed_nocheck(h, key)
        {
            RawEntryMut::Occupied(o) => Some(o.into_mut()),
            RawEntryMut::Vacant(_) => None,
        }
    }

    /// Record a decision. Returns the previous one if the key was already there.
    pub fn insert(&mut self, key: ConnKey, conn: Conn) -> Option<Conn> {
        let (h, s) = self.locate(&key);
        match self.shards[s]
            .raw_entry_mut()
            .from_key_hashed_nocheck(h, &key)
        {
            RawEntryMut::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), conn)),
            RawEntryMut::Vacant(v) => {
                v.insert_hashed_nocheck(h, key, conn);
                self.len += 1;
                None
            }
        }
    }

    pub fn remove(&mut self, key: &ConnKey) -> Option<Conn> {
        let (h, s) = self.locate(key);
        match self.shards[s]
            .raw_entry_mut()
            .from_key_hashed_nocheck(h, key)
        {
            RawEntryMut::Occupied(o) => {
                self.len -= 1;
                Some(o.remove())
            }
            RawEntryMut::Vacant(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ConnKey, &Conn)> {
        self.shards.iter().flat_map(|t| t.iter())
    }

    /// Forget every connection of one service's backend (for instance when it is removed
    /// from the pool and its flows are deleted).
    pub fn retain(&mut self, mut f: impl FnMut(&ConnKey, &mut Conn) -> bool) {
        for t in self.shards.iter_mut() {
            t.retain(|k, c| f(k, c));
        }
        self.len = self.shards.iter().map(HashMap::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn key(i: u32) -> ConnKey {
        ConnKey {
            client: Ipv4Addr::from(0x0b00_0000 + (i >> 16)),
            client_port: i as u16,
            service_addr: Ipv4Addr::new(10, 0, 0, 100),
            service_port: 80,
        }
    }

    fn conn(i: u32) -> Conn {
        Conn {
            service: 0,
            backend: (i % 7) as u16,
            created_ms: u64::from(i),
            installed: i % 2 == 0,
            reply: Reply::Unseen,
            isn: Some(i),
            tag: i as u16,
        }
    }

    /// The sharded table behaves as one map: checked against std's HashMap through
    /// inserts, replacements, removals and a retain, across many shard growths.
    #[test]
    fn behaves_as_one_map() {
        let mut t = ConnTable::new();
        let mut model = HashMap::new();
        let mut x = 12345_u32;
        for step in 0..200_000_u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let i = x % 50_000;
            match step % 5 {
                0..=2 => assert_eq!(
                    t.insert(key(i), conn(step)),
                    model.insert(key(i), conn(step))
                ),
                3 => assert_eq!(t.remove(&key(i)), model.remove(&key(i))),
                _ => assert_eq!(t.get(&key(i)), model.get(&key(i))),
            }
            assert_eq!(t.len(), model.len());
        }
        if let Some(c) = t.get_mut(&key(x % 50_000)) {
            c.installed = !c.installed;
            let m = model.get_mut(&key(x % 50_000)).expect("same keys");
            m.installed = !m.installed;
        }
        t.retain(|_, c| c.backend != 3);
        model.retain(|_, c| c.backend != 3);
        assert_eq!(t.len(), model.len());
        let mut a: Vec<_> = t.iter().map(|(k, c)| (*k, *c)).collect();
        let mut b: Vec<_> = model.into_iter().collect();
        a.sort_by_key(|e| e.0);
        b.sort_by_key(|e| e.0);
        assert_eq!(a, b);
        assert!(!t.is_empty());
    }
}
