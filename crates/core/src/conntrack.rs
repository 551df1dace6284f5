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

/// Shards of the connection table (a power of two). Many, so that each shard's occasional
/// rebuild is short: at 5M connections a shard holds ~1,200 entries (measured: 569–625 of
/// 5M SYNs over 100 µs, 12–16 over 500 µs; `docs/benchmarks.md`, stop 8). More shards
/// shorten the rebuilds but their headers fall out of cache (16,384 lowered the peak).
const SHARDS: usize = 4096;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

/// Live connections, keyed as the client sees them.
///
/// Built for the PACKET_IN path, where almost every lookup is a new connection's SYN that
/// misses, followed by its insert, in a table of millions that lives in DRAM:
/// - Each shard keeps its entries densely in insertion order (a `Vec`: an insert writes at
///   its end, a line in cache) and finds them through an open-addressed index of 8-byte
///   slots (linear probing, at most half full): a 32-bit tag of the hash and the entry's
///   position. A miss reads one index line and no entry; an insert writes that line and
///   the entries' end. A general hash map touches its control bytes, its entry and, while
///   it grows, the entries it moves: three or more lines from DRAM per SYN (a third of
///   the controller's CPU in the 16-switch bench, with `griddle`).
/// - That one line is known from the key alone, so [`ConnTable::prefetch`] can load it
///   for a whole batch of PACKET_INs before they are handled, and the loads overlap.
/// - A shard outgrows its index by rebuilding it whole, but a shard is 1/4096 of the
///   table: rebuilds stay short, unlike one big table's (hashbrown's doubling of a 256th
///   of 5M connections took over 500 µs, the longest pause of the PACKET_IN path).
///
/// The shard is chosen by the top 12 bits of a keyed hash (ahash); the slot and the tag
/// both come from its bits 20..52 (the slot from the tag's low bits).
#[derive(Debug)]
pub struct ConnTable {
    hasher: RandomState,
    shards: Box<[Shard]>,
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
        ConnTable {
            shards: (0..SHARDS).map(|_| Shard::with_capacity(per)).collect(),
            hasher: RandomState::new(),
            len: 0,
        }
    }

    /// The key's hash and its shard.
    #[inline]
    fn locate(&self, key: &ConnKey) -> (u64, usize) {
        let h = self.hasher.hash_one(key);
        (h, (h >> (64 - SHARD_BITS)) as usize)
    }

    #[inline]
    fn shard(&self, s: usize) -> &Shard {
        // `locate` yields `s < SHARDS`, the shards' count.
        &self.shards[s & (SHARDS - 1)]
    }

    #[inline]
    fn shard_mut(&mut self, s: usize) -> &mut Shard {
        &mut self.shards[s & (SHARDS - 1)]
    }

    /// A shard to change, and the hasher its removals need (borrowed side by side).
    #[inline]
    fn shard_and_hasher(&mut self, s: usize) -> (&mut Shard, &RandomState) {
        (&mut self.shards[s & (SHARDS - 1)], &self.hasher)
    }

    /// Start loading the lines a new connection's lookup and insert touch: the index line
    /// its probe starts on, and the end of its shard's entries, where the insert writes
    /// (prefetch instructions: the CPU does not wait for them, and an address past the
    /// allocation is no fault). Called for each PACKET_IN of a batch before the batch is
    /// handled, so that their misses overlap instead of stalling the decisions one after
    /// another. The entries' end is cold too: 4,095 other shards' inserts come between
    /// two of one shard's, and a store that misses holds up every store after it (the
    /// rule encoder's, which stalled on them).
    #[inline]
    pub fn prefetch(&self, key: &ConnKey) {
        let (h, s) = self.locate(key);
        let shard = self.shard(s);
        if !shard.index.is_empty() {
            prefetch_index::prefetch_index(&shard.index, shard.home(h));
        }
        // An entry (40 bytes) may reach into the next line: that of the entry after it.
        const _: () = assert!(std::mem::size_of::<(ConnKey, Conn)>() <= 64);
        let end = shard.entries.len();
        prefetch_index::prefetch_index(&shard.entries, end);
        prefetch_index::prefetch_index(&shard.entries, end + 1);
    }

    pub fn get(&self, key: &ConnKey) -> Option<&Conn> {
        let (h, s) = self.locate(key);
        let shard = self.shard(s);
        shard
            .find(h, key)
            .and_then(|(_, e)| shard.entries.get(e))
            .map(|(_, c)| c)
    }

    pub fn get_mut(&mut self, key: &ConnKey) -> Option<&mut Conn> {
        let (h, s) = self.locate(key);
        let shard = self.shard_mut(s);
        let (_, e) = shard.find(h, key)?;
        shard.entries.get_mut(e).map(|(_, c)| c)
    }

    /// Record a decision. Returns the previous one if the key was already there.
    pub fn insert(&mut self, key: ConnKey, conn: Conn) -> Option<Conn> {
        let (h, s) = self.locate(&key);
        let shard = self.shard_mut(s);
        if let Some((_, e)) = shard.find(h, &key) {
            return shard
                .entries
                .get_mut(e)
                .map(|(_, c)| std::mem::replace(c, conn));
        }
        shard.push(h, key, conn);
        self.len += 1;
        None
    }

    pub fn remove(&mut self, key: &ConnKey) -> Option<Conn> {
        let (h, s) = self.locate(key);
        let (shard, hasher) = self.shard_and_hasher(s);
        let removed = shard.remove(h, key, hasher);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ConnKey, &Conn)> {
        self.shards
            .iter()
            .flat_map(|s| s.entries.iter().map(|(k, c)| (k, c)))
    }

    /// Keep only the connections `f` accepts (for instance, forget every connection of a
    /// backend removed from its pool, whose flows are deleted).
    pub fn retain(&mut self, mut f: impl FnMut(&ConnKey, &mut Conn) -> bool) {
        for s in self.shards.iter_mut() {
            let before = s.entries.len();
            s.entries.retain_mut(|(k, c)| f(k, c));
            if s.entries.len() != before {
                s.rebuild(s.index.len(), &self.hasher);
            }
        }
        self.len = self.shards.iter().map(|s| s.entries.len()).sum();
    }
}

/// One shard: its entries, dense, and an index over them.
#[derive(Debug, Default)]
struct Shard {
    /// Open addressing with linear probing; a power of two long (or empty). A slot is 0
    /// when free, else the hash's tag in its high half and the entry's position plus one
    /// in its low half.
    index: Box<[u64]>,
    entries: Vec<(ConnKey, Conn)>,
}

/// The hash's bits kept in a slot: 20..52, below the 12 that pick the shard.
#[inline]
fn tag(h: u64) -> u32 {
    (h >> 20) as u32
}

/// An occupied slot: the tag of `h` in the high half, entry position `e` plus one (0 is
/// a free slot) in the low half.
#[inline]
fn slot_of(h: u64, e: usize) -> u64 {
    (u64::from(tag(h)) << 32) | (e as u64 + 1)
}

impl Shard {
    fn with_capacity(n: usize) -> Shard {
        let mut s = Shard {
            index: Box::default(),
            entries: Vec::with_capacity(n),
        };
        if n > 0 {
            s.index = vec![0; index_len_for(n)].into_boxed_slice();
        }
        s
    }

    #[inline]
    fn mask(&self) -> usize {
        self.index.len().wrapping_sub(1)
    }

    /// The slot where a probe for hash `h` starts.
    #[inline]
    fn home(&self, h: u64) -> usize {
        tag(h) as usize & self.mask()
    }

    /// The slot and entry position of `key`.
    #[inline]
    fn find(&self, h: u64, key: &ConnKey) -> Option<(usize, usize)> {
        let mask = self.mask();
        let t = tag(h);
        let mut i = self.home(h);
        // The index is never full (at most half), so a free slot ends every probe.
        loop {
            let slot = *self.index.get(i)?;
            if slot == 0 {
                return None;
            }
            if (slot >> 32) as u32 == t {
                let e = (slot as u32 as usize).wrapping_sub(1);
                if self.entries.get(e).is_some_and(|(k, _)| k == key) {
                    return Some((i, e));
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// The first free slot of `h`'s probe sequence.
    #[inline]
    fn free_slot(&self, h: u64) -> usize {
        self.free_slot_from(self.home(h))
    }

    /// The first free slot at or after slot `i` (cyclically).
    #[inline]
    fn free_slot_from(&self, mut i: usize) -> usize {
        let mask = self.mask();
        while self.index.get(i).is_some_and(|&s| s != 0) {
            i = (i + 1) & mask;
        }
        i
    }

    /// Append a key known to be absent.
    fn push(&mut self, h: u64, key: ConnKey, conn: Conn) {
        if (self.entries.len() + 1) * 2 > self.index.len() {
            self.resize_index(index_len_for(self.entries.len() + 1));
        }
        let i = self.free_slot(h);
        if let Some(slot) = self.index.get_mut(i) {
            *slot = slot_of(h, self.entries.len());
        }
        self.entries.push((key, conn));
    }

    fn remove(&mut self, h: u64, key: &ConnKey, hasher: &RandomState) -> Option<Conn> {
        let (i, e) = self.find(h, key)?;
        self.delete_slot(i);
        let last = self.entries.len() - 1;
        if e != last {
            // The last entry moves into the gap: its slot must say so.
            let moved_h = self.entries.get(last).map(|(k, _)| hasher.hash_one(k))?;
            let moved_key = self.entries.get(last).map(|(k, _)| *k)?;
            if let Some((j, _)) = self.find(moved_h, &moved_key)
                && let Some(slot) = self.index.get_mut(j)
            {
                *slot = (*slot & !0xffff_ffff) | (e as u64 + 1);
            }
        }
        let removed = self.entries.swap_remove(e).1;
        // A shard that held a flood's connections gives its memory back once they are
        // gone: below an eighth of its index (a quarter of what it grows at, so that a
        // shard near a boundary does not rebuild back and forth).
        if self.entries.len() * 8 < self.index.len() && self.index.len() > MIN_SHRINK_SLOTS {
            self.entries.shrink_to(self.entries.len() * 2);
            self.resize_index(index_len_for(self.entries.len()));
        }
        Some(removed)
    }

    /// Free slot `i`, then shift back the entries after it that probed past it (backward
    /// shift deletion: no tombstones, probes stay as short as at insertion).
    fn delete_slot(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let slot = self.index.get(j).copied().unwrap_or(0);
            if slot == 0 {
                break;
            }
            let home = (slot >> 32) as usize & mask;
            // The entry at j may fill the hole if the hole lies on its probe path, that
            // is between its home and j (cyclically).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                if let Some(h) = self.index.get_mut(hole) {
                    *h = slot;
                }
                hole = j;
            }
        }
        if let Some(h) = self.index.get_mut(hole) {
            *h = 0;
        }
    }

    /// A new index of `len` slots (a power of two) over the same entries, made from the
    /// old index alone: a slot's tag holds the hash bits its home is taken from (an index
    /// is far shorter than 2^32 slots), and its entry's position has not changed. No
    /// entry is read or hashed again, so a shard's growth touches its index only: at 5M
    /// connections a growth read the shard's ~100 KB of entries and hashed each, for
    /// the pauses of `docs/benchmarks.md` (stop 8).
    fn resize_index(&mut self, len: usize) {
        let old = std::mem::replace(&mut self.index, vec![0; len].into_boxed_slice());
        let mask = self.mask();
        for &slot in old.iter().filter(|&&s| s != 0) {
            let i = self.free_slot_from((slot >> 32) as usize & mask);
            if let Some(s) = self.index.get_mut(i) {
                *s = slot;
            }
        }
    }

    /// A new index of `len` slots over the entries as they are, hashing each (after
    /// their positions changed: `ConnTable::retain`).
    fn rebuild(&mut self, len: usize, hasher: &RandomState) {
        let len = len.max(index_len_for(self.entries.len()));
        self.index = vec![0; len].into_boxed_slice();
        for e in 0..self.entries.len() {
            let Some(h) = self.entries.get(e).map(|(k, _)| hasher.hash_one(k)) else {
                break;
            };
            let i = self.free_slot(h);
            if let Some(slot) = self.index.get_mut(i) {
                *slot = slot_of(h, e);
            }
        }
    }
}

/// Indexes this small are not shrunk (a shard of a few connections keeps its few lines).
const MIN_SHRINK_SLOTS: usize = 64;

/// Index slots for `n` entries: a power of two, at least twice `n` (linear probing's
/// probes stay short below half full), at least 8.
fn index_len_for(n: usize) -> usize {
    (n * 2).next_power_of_two().max(8)
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

    /// A shard under crafted hashes: long probe runs that wrap around the index's end,
    /// removals from their middles (backward shifts), and entries moved by removals, all
    /// checked against a model after each step. The shard hashes only the entries that
    /// removals move, with this hasher, so every key's hash here is the hasher's own.
    #[test]
    fn shard_probe_runs_and_deletions() {
        let hasher = RandomState::with_seeds(1, 2, 3, 4);
        let mut shard = Shard::default();
        let mut model: HashMap<ConnKey, Conn> = HashMap::new();
        // Keys whose hashes share their home slot's low bits, so that they collide once the
        // index is small: found by trying keys until 64 share the 3 lowest bits of the tag.
        let mut keys = Vec::new();
        let mut i = 0;
        while keys.len() < 64 {
            let k = key(i);
            if tag(hasher.hash_one(k)) & 7 == 7 {
                keys.push(k);
            }
            i += 1;
        }
        let check = |shard: &Shard, model: &HashMap<ConnKey, Conn>| {
            for k in &keys {
                let got = shard
                    .find(hasher.hash_one(k), k)
                    .and_then(|(_, e)| shard.entries.get(e))
                    .map(|(_, c)| *c);
                assert_eq!(got, model.get(k).copied(), "{k:?}");
            }
            assert_eq!(shard.entries.len(), model.len());
            assert!(shard.entries.len() * 2 <= shard.index.len().max(1));
        };
        for (n, k) in keys.iter().enumerate() {
            shard.push(hasher.hash_one(k), *k, conn(n as u32));
            model.insert(*k, conn(n as u32));
            check(&shard, &model);
        }
        // Remove every third key, from the middles of runs, then re-add some.
        for (n, k) in keys.iter().enumerate().filter(|(n, _)| n % 3 == 1) {
            assert_eq!(
                shard.remove(hasher.hash_one(k), k, &hasher),
                model.remove(k),
                "remove {n}"
            );
            check(&shard, &model);
        }
        for (n, k) in keys.iter().enumerate().filter(|(n, _)| n % 6 == 1) {
            shard.push(hasher.hash_one(k), *k, conn(1000 + n as u32));
            model.insert(*k, conn(1000 + n as u32));
            check(&shard, &model);
        }
        // Absent keys miss, and removing one changes nothing.
        let absent = key(1 << 30);
        assert_eq!(
            shard.remove(hasher.hash_one(absent), &absent, &hasher),
            None
        );
        check(&shard, &model);
        // Everything out, in reverse order.
        for k in keys.iter().rev() {
            assert_eq!(
                shard.remove(hasher.hash_one(k), k, &hasher),
                model.remove(k)
            );
            check(&shard, &model);
        }
        assert!(shard.index.iter().all(|&s| s == 0), "no slot left behind");
    }

    /// After a flood: a million connections in, all but a thousand out; the table gives
    /// its memory back (index slots and entry capacity), and the rest are still found.
    #[test]
    fn a_drained_table_shrinks() {
        let mut t = ConnTable::new();
        let slots = |t: &ConnTable| t.shards.iter().map(|s| s.index.len()).sum::<usize>();
        let capacity = |t: &ConnTable| t.shards.iter().map(|s| s.entries.capacity()).sum::<usize>();
        for i in 0..1_000_000 {
            t.insert(key(i), conn(i));
        }
        let (full_slots, full_capacity) = (slots(&t), capacity(&t));
        for i in 1000..1_000_000 {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        assert_eq!(t.len(), 1000);
        for i in 0..1000 {
            assert_eq!(t.get(&key(i)), Some(&conn(i)), "{i}");
        }
        // Each of the 4,096 shards keeps up to MIN_SHRINK_SLOTS: with 1,000 left, that floor
        // is most of what remains (without shrinking, all of the full table's stays).
        assert!(
            slots(&t) * 4 < full_slots && capacity(&t) * 4 < full_capacity,
            "index slots {} of {full_slots}, capacity {} of {full_capacity}",
            slots(&t),
            capacity(&t)
        );
    }

    /// At the bench's scale: a million keys in, half out, the rest still found.
    #[test]
    fn a_million_connections() {
        let mut t = ConnTable::new();
        for i in 0..1_000_000 {
            assert_eq!(t.insert(key(i), conn(i)), None);
        }
        for i in (0..1_000_000).step_by(2) {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        assert_eq!(t.len(), 500_000);
        for i in 0..1_000_000 {
            t.prefetch(&key(i));
            assert_eq!(
                t.get(&key(i)),
                (i % 2 == 1).then(|| conn(i)).as_ref(),
                "{i}"
            );
        }
    }
}
