//! The connection table: each client connection's backend, decided once and kept.
//!
//! Rules take effect in Open vSwitch's userspace datapath a little after the switch
//! accepts them, so several packets of a new connection (retransmitted SYNs, the first
//! ACK, the request, the backend's SYN-ACK) can still reach the controller. Each of them
//! must get the same answer as the first, in both directions; so the decision is recorded
//! here and applied to every packet of the connection that comes up, and it is only
//! forgotten when the switch reports the connection's rule gone.

use std::net::Ipv4Addr;
use std::num::NonZeroU32;

use ahash::RandomState;

use crate::topology::MacId;

/// A backend's number in its service, for as long as the service lives: given when the
/// backend joins the pool and never given to another while the service keeps it, across
/// the pool's changes and reloads, where its position in the pool shifts (the service
/// keeps what each number stands for: `service::ServiceState`). A connection names its
/// backend by it, so that this table, millions of entries, is not rewritten under the
/// lock the PACKET_IN path waits for when a backend leaves (a pass that took 32–41 ms
/// with 2.8 million connections; `docs/benchmarks.md`, stop 47).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BackendId(pub u16);

/// A client connection as the client sees it: to the service address (the VIP, or the
/// backend address the client asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    pub client: Ipv4Addr,
    pub client_port: u16,
    pub service_addr: Ipv4Addr,
    pub service_port: u16,
}

impl ConnKey {
    /// The key of a segment from the client `src` to the service address `dst`.
    pub fn of_client_segment(src: Ipv4Addr, dst: Ipv4Addr, tcp: &flowgate_packet::Tcp<'_>) -> Self {
        ConnKey {
            client: src,
            client_port: tcp.src_port,
            service_addr: dst,
            service_port: tcp.dst_port,
        }
    }

    /// The connection's hash, which of equal-cost paths its rules take
    /// (`Topology::flow_path`): the same for its whole life, different between its
    /// connections, so a client's connections spread too.
    pub fn flow_hash(&self) -> u64 {
        let client = (u64::from(u32::from(self.client)) << 16) | u64::from(self.client_port);
        let service =
            (u64::from(u32::from(self.service_addr)) << 16) | u64::from(self.service_port);
        crate::topology::mix64(client ^ crate::topology::mix64(service))
    }
}

/// What was decided for one connection. Kept small: the table holds one per live
/// connection, and the target is under 200 bytes each including the map's overhead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    pub service: u16,
    /// Its backend's number in the service: kept when the backend leaves the pool, so
    /// that a pool change does not rewrite the table.
    pub backend: BackendId,
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
    /// connection rebuilt from a switch's rules, whose SYN was never seen, and for an ISN
    /// of 0 (one SYN in 2^32), kept as "not seen" so that the field takes 4 bytes: a
    /// retransmission of that SYN is then taken for a new connection on the 4-tuple, which
    /// keeps its backend if the backend can take it.
    pub isn: Option<NonZeroU32>,
    /// Tag of this decision in its rules' cookies, so a FLOW_REMOVED of an earlier
    /// connection on the same 4-tuple is told apart from this one's.
    pub tag: u16,
    /// The MAC the client's packets come from (its own, or its router's), which says where
    /// the client is.
    pub client_mac: MacId,
}

// One per live connection: the entry is 40 bytes with its key (see `Entries`).
const _: () = assert!(std::mem::size_of::<Conn>() == 24);

impl Conn {
    /// Whether a SYN with this sequence number is this connection's own (retransmitted).
    pub fn is_own_syn(&self, seq: u32) -> bool {
        self.isn.is_some_and(|isn| isn.get() == seq)
    }

    /// The ISN to keep for a SYN with this sequence number.
    pub fn isn_of(seq: u32) -> Option<NonZeroU32> {
        NonZeroU32::new(seq)
    }
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
    /// The client sent its SYN again [`crate::controller::SILENT_AFTER_MS`] or more after
    /// the decision: no SYN-ACK reached it in that time. Judged then, not again when the
    /// rules end.
    Silent,
}

/// Shards of the connection table (a power of two). Many, so that each shard's occasional
/// index growth is short: at 5M connections a shard's index is 32 KB (measured at 5M: 31–40
/// of 5M SYNs over 100 µs, 1–7 over 500 µs; 569–625 and 12–16 when a growth also rehashed
/// the shard's entries; `docs/benchmarks.md`, stops 8 and 9). More shards shorten the
/// growths but their headers fall out of cache (16,384 lowered the peak).
const SHARDS: usize = 4096;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

/// Entries per chunk of the table's storage (a power of two): 640 KB each.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

/// The most entries a table holds: a slot keeps an entry's position plus one in 32 bits.
const MAX_ENTRIES: usize = u32::MAX as usize - 1;

/// Live connections, keyed as the client sees them.
///
/// Built for the PACKET_IN path, where almost every lookup is a new connection's SYN that
/// misses, followed by its insert, in a table of millions that lives in DRAM:
/// - The entries are kept densely, in insertion order, in one store of fixed-size chunks:
///   an insert writes at its end, a line that stays in cache from one insert to the next,
///   and a chunk is never moved or copied once allocated (a vector per shard wrote 4,096
///   different lines that missed, and copied each shard's entries when it grew).
/// - Each shard finds its entries through an open-addressed index of 8-byte slots (linear
///   probing, at most about half full): a 32-bit tag of the hash and the entry's position.
///   A miss reads one index line and no entry; an insert writes that line and the end of
///   the store. A general hash map touches its control bytes, its entry and, while it
///   grows, the entries it moves: three or more lines from DRAM per SYN (a third of the
///   controller's CPU in the 16-switch bench, with `griddle`).
/// - That one line is known from the key alone, so [`ConnTable::prefetch`] can load it
///   for a whole batch of PACKET_INs before they are handled, and the loads overlap.
/// - A shard outgrows its index by building a twice larger one from the old alone, but a
///   shard is 1/4096 of the table: growths stay short, unlike one big table's (hashbrown's
///   doubling of a 256th of 5M connections took over 500 µs, the longest pause of the
///   PACKET_IN path). The shards grow at loads spread between 0.41 and 0.59, so that they
///   do not all grow at about the same count.
/// - A removal moves the last entry into the hole (the store stays dense) and mends that
///   entry's slot; the store gives an emptied chunk back once the chunk before it is under
///   half full, and a shard's index shrinks below an eighth full.
///
/// The shard is chosen by the top 12 bits of a keyed hash (ahash); the slot and the tag
/// both come from its bits 20..52 (the slot from the tag's low bits).
#[derive(Debug)]
pub struct ConnTable {
    hasher: RandomState,
    shards: Box<[Shard]>,
    entries: Entries,
    /// Entries each shard's index was built for by [`ConnTable::with_capacity`] (0: none):
    /// it keeps that index however few entries it holds.
    reserved_per_shard: usize,
}

impl Default for ConnTable {
    fn default() -> Self {
        Self::with_hasher(RandomState::new())
    }
}

impl ConnTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_hasher(hasher: RandomState) -> Self {
        ConnTable {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher,
            entries: Entries::default(),
            reserved_per_shard: 0,
        }
    }

    /// A table built for `n` connections (`[controller] preallocate_connections`): every
    /// shard's index as long as `n` connections would grow it, the store's chunks for `n`
    /// entries, and all of it written once here, so that the kernel has mapped its pages.
    /// Until the table holds about `n`, an insert neither grows an index (a new one built
    /// and the old one's slots moved) nor meets a page the kernel has yet to zero and
    /// map: both on the PACKET_IN path otherwise (in `flowgate bench controller` at
    /// 600,000 setups/s, with the controller's CPU about half busy, page faults took
    /// 2.5–5 % of its time and index growth 0.5–0.7 %). Built for the connections the run
    /// reached, it took 6 % off the CPU per setup; built for twice as many, about half of
    /// that, as the larger index misses the TLB more (`docs/benchmarks.md`, stop 38).
    /// What it builds is kept when the connections end; past `n` the table grows as any
    /// other. About 65 bytes per connection, taken at once.
    pub fn with_capacity(n: usize) -> Self {
        let mut t = Self::default();
        if n == 0 {
            return t;
        }
        // A shard holds n / SHARDS on average; hashing spreads them binomially, so the
        // fullest of 4,096 shards holds about four standard deviations more.
        let mean = n.div_ceil(SHARDS);
        let fullest = mean + 4 * mean.isqrt() + 8;
        for (s, shard) in t.shards.iter_mut().enumerate() {
            shard.index = touched(vec![0; index_len_holding(s, fullest)]).into_boxed_slice();
        }
        t.reserved_per_shard = fullest;
        t.entries.reserve(n.min(MAX_ENTRIES));
        t
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

    /// Start loading the index line a lookup of `key` reads first (a prefetch
    /// instruction: the CPU does not wait for it). Called for each PACKET_IN of a batch
    /// before the batch is handled, so that their misses overlap instead of stalling the
    /// decisions one after another. (An insert also writes the store's end, which stays
    /// in cache.)
    #[inline]
    pub fn prefetch(&self, key: &ConnKey) {
        let (h, s) = self.locate(key);
        let shard = self.shard(s);
        if !shard.index.is_empty() {
            prefetch_index::prefetch_index(&shard.index, shard.home(h));
        }
    }

    pub fn get(&self, key: &ConnKey) -> Option<&Conn> {
        let (h, s) = self.locate(key);
        let (_, e) = self.shard(s).find(h, key, &self.entries)?;
        self.entries.get(e).map(|(_, c)| c)
    }

    pub fn get_mut(&mut self, key: &ConnKey) -> Option<&mut Conn> {
        let (h, s) = self.locate(key);
        let (_, e) = self.shard(s).find(h, key, &self.entries)?;
        self.entries.get_mut(e).map(|(_, c)| c)
    }

    /// Record a decision. Returns the previous one if the key was already there. A table
    /// at `MAX_ENTRIES` takes no new key (4 billion connections: memory runs out first).
    pub fn insert(&mut self, key: ConnKey, conn: Conn) -> Option<Conn> {
        let (h, s) = self.locate(&key);
        let shard = &mut self.shards[s & (SHARDS - 1)];
        if let Some((_, e)) = shard.find(h, &key, &self.entries) {
            return self
                .entries
                .get_mut(e)
                .map(|(_, c)| std::mem::replace(c, conn));
        }
        if self.entries.len >= MAX_ENTRIES {
            return None;
        }
        shard.grow_for(s, shard.len + 1);
        let i = shard.free_slot(h);
        if let Some(slot) = shard.index.get_mut(i) {
            *slot = slot_of(h, self.entries.len);
        }
        shard.len += 1;
        self.entries.push((key, conn));
        None
    }

    pub fn remove(&mut self, key: &ConnKey) -> Option<Conn> {
        self.remove_if(key, |_| true)
    }

    /// Remove the connection of `key` if `f` accepts it: one lookup, where a `get` and
    /// then a `remove` would make two.
    pub fn remove_if(&mut self, key: &ConnKey, f: impl FnOnce(&Conn) -> bool) -> Option<Conn> {
        let (h, s) = self.locate(key);
        let shard = &mut self.shards[s & (SHARDS - 1)];
        let (i, e) = shard.find(h, key, &self.entries)?;
        if !self.entries.get(e).is_some_and(|(_, c)| f(c)) {
            return None;
        }
        shard.delete_slot(i);
        shard.len -= 1;
        shard.shrink_if_sparse(s, self.reserved_per_shard);
        let last = self.entries.len - 1;
        if e != last {
            // The last entry moves into the hole: its slot must say so.
            let moved = self.entries.get(last).map(|(k, _)| *k)?;
            let (mh, ms) = self.locate(&moved);
            let mshard = &mut self.shards[ms & (SHARDS - 1)];
            if let Some((j, _)) = mshard.find(mh, &moved, &self.entries)
                && let Some(slot) = mshard.index.get_mut(j)
            {
                *slot = slot_of(mh, e);
            }
        }
        self.entries.swap_remove(e).map(|(_, c)| c)
    }

    pub fn len(&self) -> usize {
        self.entries.len
    }

    /// The connection at position `i` of the store (`0..len()`). A removal moves the last
    /// entry into its hole, and an insert appends: entries only ever move down, so a walk
    /// from the end down visits every entry that was there when it started and is there
    /// when it ends (some twice), whatever is removed or added between its steps.
    pub fn at(&self, i: usize) -> Option<(&ConnKey, &Conn)> {
        self.entries.get(i).map(|(k, c)| (k, c))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ConnKey, &Conn)> {
        self.entries.chunks.iter().flatten().map(|(k, c)| (k, c))
    }

    /// Keep only the connections `f` accepts (for instance, forget every connection of a
    /// backend removed from its pool, whose flows are deleted). In place: each one `f`
    /// refuses is removed as [`ConnTable::remove`] does, and the entry that takes its
    /// place (one not yet seen) is offered next.
    pub fn retain(&mut self, mut f: impl FnMut(&ConnKey, &mut Conn) -> bool) {
        let mut p = 0;
        while p < self.entries.len {
            let Some((k, c)) = self.entries.get_mut(p) else {
                break;
            };
            if f(k, c) {
                p += 1;
            } else {
                let k = *k;
                self.remove(&k);
            }
        }
    }
}

/// The table's entries, dense: position `p` is entry `p % CHUNK` of chunk `p / CHUNK`.
/// The chunks before the one of position `len` are full; after it there may be one empty
/// chunk, kept for the next pushes.
#[derive(Debug, Default)]
struct Entries {
    chunks: Vec<Vec<(ConnKey, Conn)>>,
    len: usize,
    /// Chunks kept however few entries the store holds ([`Entries::reserve`]).
    reserved: usize,
}

impl Entries {
    #[inline]
    fn get(&self, p: usize) -> Option<&(ConnKey, Conn)> {
        self.chunks.get(p >> CHUNK_BITS)?.get(p & (CHUNK - 1))
    }

    #[inline]
    fn get_mut(&mut self, p: usize) -> Option<&mut (ConnKey, Conn)> {
        self.chunks
            .get_mut(p >> CHUNK_BITS)?
            .get_mut(p & (CHUNK - 1))
    }

    /// Chunks for `n` entries, written once (see [`ConnTable::with_capacity`]), kept
    /// however few entries the store holds.
    fn reserve(&mut self, n: usize) {
        let filler = (
            ConnKey {
                client: Ipv4Addr::UNSPECIFIED,
                client_port: 0,
                service_addr: Ipv4Addr::UNSPECIFIED,
                service_port: 0,
            },
            Conn {
                service: 0,
                backend: BackendId(0),
                created_ms: 0,
                installed: false,
                reply: Reply::Unseen,
                isn: None,
                tag: 0,
                client_mac: MacId::UNKNOWN,
            },
        );
        while self.chunks.len() < n.div_ceil(CHUNK) {
            let mut chunk = touched(vec![filler; CHUNK]);
            chunk.clear();
            self.chunks.push(chunk);
        }
        self.reserved = self.chunks.len();
    }

    /// Append at position `len`.
    #[inline]
    fn push(&mut self, e: (ConnKey, Conn)) {
        let c = self.len >> CHUNK_BITS;
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.push(e);
            self.len += 1;
        }
    }

    /// Remove position `p`, the last entry taking its place.
    fn swap_remove(&mut self, p: usize) -> Option<(ConnKey, Conn)> {
        if p >= self.len {
            return None;
        }
        let last = self.chunks.get_mut((self.len - 1) >> CHUNK_BITS)?.pop()?;
        self.len -= 1;
        let removed = if p == self.len {
            last
        } else {
            std::mem::replace(self.get_mut(p)?, last)
        };
        // An emptied chunk is kept while the one before it is at least half full, so that
        // a table that hovers about a chunk's boundary does not allocate and free 640 KB
        // over and over; then it goes back to the allocator.
        let tail = self.len >> CHUNK_BITS;
        if self.chunks.len() > (tail + 1).max(self.reserved) && self.len & (CHUNK - 1) < CHUNK / 2 {
            self.chunks.truncate((tail + 1).max(self.reserved));
        }
        Some(removed)
    }
}

/// One shard: an index over its entries in the table's store.
#[derive(Debug, Default)]
struct Shard {
    /// Open addressing with linear probing; a power of two long (or empty). A slot is 0
    /// when free, else the hash's tag in its high half and the entry's position plus one
    /// in its low half.
    index: Box<[u64]>,
    /// Entries of this shard.
    len: usize,
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
    fn find(&self, h: u64, key: &ConnKey, entries: &Entries) -> Option<(usize, usize)> {
        let mask = self.mask();
        let t = tag(h);
        let mut i = self.home(h);
        // The index is never full (at most 0.59), so a free slot ends every probe.
        loop {
            let slot = *self.index.get(i)?;
            if slot == 0 {
                return None;
            }
            if (slot >> 32) as u32 == t {
                let e = (slot as u32 as usize).wrapping_sub(1);
                if entries.get(e).is_some_and(|(k, _)| k == key) {
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

    /// Make room for `n` entries in shard number `s`: an index twice as long once `n`
    /// passes the shard's load limit, between 26/64 and 38/64 by its number.
    #[inline]
    fn grow_for(&mut self, s: usize, n: usize) {
        if n * 64 > self.index.len() * load_limit(s) {
            self.resize_index((self.index.len() * 2).max(8));
        }
    }

    /// A shard that held a flood's connections gives its memory back once they are gone:
    /// below an eighth of its index (well under what it grows at, so that a shard near a
    /// boundary does not resize back and forth), down to what it was built for (it is
    /// shard number `s` of a table built for `reserved` entries a shard; 0: none).
    fn shrink_if_sparse(&mut self, s: usize, reserved: usize) {
        if self.len * 8 < self.index.len() && self.index.len() > MIN_SHRINK_SLOTS {
            let floor = if reserved == 0 {
                0
            } else {
                index_len_holding(s, reserved)
            };
            if self.index.len() > floor {
                self.resize_index(index_len_for(self.len).max(floor));
            }
        }
    }

    /// A new index of `len` slots (a power of two) over the same entries, made from the
    /// old index alone: a slot's tag holds the hash bits its home is taken from (an index
    /// is far shorter than 2^32 slots), and its entry's position has not changed. No
    /// entry is read or hashed again, so a shard's growth touches its index only (at 5M
    /// connections, rehashing a shard's entries to grow it made the pauses of
    /// `docs/benchmarks.md`, stop 8).
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
}

/// Indexes this small are not shrunk (a shard of a few connections keeps its few lines).
const MIN_SHRINK_SLOTS: usize = 64;

/// Shard `s`'s load limit, in 64ths: it grows its index past it.
#[inline]
fn load_limit(s: usize) -> usize {
    26 + s % 13
}

/// The index shard `s` has once it has grown for `n` entries ([`Shard::grow_for`]).
fn index_len_holding(s: usize, n: usize) -> usize {
    let mut len = 8;
    while n * 64 > len * load_limit(s) {
        len *= 2;
    }
    len
}

/// `v` with each element written, so that its pages are mapped now: `vec![x; n]` may take
/// its memory fresh from the kernel, known to be zero, and then write none of it.
fn touched<T: Copy>(mut v: Vec<T>) -> Vec<T> {
    for x in v.iter_mut() {
        // Opaque to the compiler, so the store is not dropped as one of a value known
        // to be there.
        *x = std::hint::black_box(*x);
    }
    v
}

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
            backend: BackendId((i % 7) as u16),
            created_ms: u64::from(i),
            installed: i.is_multiple_of(2),
            reply: Reply::Unseen,
            isn: Conn::isn_of(i),
            tag: i as u16,
            client_mac: MacId::UNKNOWN,
        }
    }

    /// `[controller] preallocate_connections`: up to its capacity the table neither grows
    /// nor gives back; past it, it grows and shrinks as any other, not below what it was
    /// built for.
    #[test]
    fn a_preallocated_table_keeps_its_size_within_its_capacity() {
        let n = 100_000;
        let slots = |t: &ConnTable| t.shards.iter().map(|s| s.index.len()).collect::<Vec<_>>();
        let mut t = ConnTable::with_capacity(n);
        let built = slots(&t);
        let chunks = t.entries.chunks.len();
        assert!(chunks * CHUNK >= n);
        assert!(built.iter().all(|&l| l > 8), "{built:?}");
        for i in 0..n as u32 {
            assert_eq!(t.insert(key(i), conn(i)), None);
        }
        assert_eq!(slots(&t), built, "no shard's index grew");
        assert_eq!(t.entries.chunks.len(), chunks, "no chunk was added");
        assert!((0..n as u32).all(|i| t.get(&key(i)) == Some(&conn(i))));
        for i in 0..n as u32 {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        assert!(t.is_empty());
        assert_eq!(slots(&t), built, "no shard's index shrank");
        assert_eq!(t.entries.chunks.len(), chunks, "the chunks stayed");

        let more = 4 * n as u32;
        for i in 0..more {
            t.insert(key(i), conn(i));
        }
        let grown = slots(&t);
        assert!(grown.iter().zip(&built).all(|(now, was)| now >= was));
        assert!(grown.iter().sum::<usize>() > built.iter().sum::<usize>());
        assert!((0..more).all(|i| t.get(&key(i)) == Some(&conn(i))));
        for i in 0..more {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        assert_eq!(slots(&t), built, "back to what it was built for");
        assert_eq!(t.entries.chunks.len(), chunks);
        // An ordinary table gives its memory back.
        let mut plain = ConnTable::new();
        for i in 0..more {
            plain.insert(key(i), conn(i));
        }
        for i in 0..more {
            plain.remove(&key(i));
        }
        assert!(slots(&plain).iter().all(|&l| l <= MIN_SHRINK_SLOTS));
        assert!(plain.entries.chunks.len() <= 1);
    }

    /// What `with_capacity` builds is in memory when it returns (not left for the first
    /// inserts to fault in): the process's resident set grew by all of it. (nextest runs
    /// each test in a process of its own.)
    #[cfg(target_os = "linux")]
    #[test]
    fn a_preallocated_table_is_resident_at_once() {
        fn resident() -> usize {
            let status = std::fs::read_to_string("/proc/self/status").expect("status");
            let kb = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
                .expect("VmRSS");
            kb * 1024
        }
        let before = resident();
        let t = ConnTable::with_capacity(1_000_000);
        let grew = resident().saturating_sub(before);
        let built = t.shards.iter().map(|s| s.index.len() * 8).sum::<usize>()
            + t.entries.chunks.len() * CHUNK * std::mem::size_of::<(ConnKey, Conn)>();
        assert!(
            grew * 10 >= built * 9,
            "{grew} bytes resident of {built} built"
        );
    }

    #[test]
    fn remove_if_removes_only_what_it_accepts() {
        let mut t = ConnTable::new();
        let k = key(1);
        t.insert(k, conn(3));
        assert_eq!(
            t.remove_if(&k, |c| c.tag == 4),
            None,
            "another connection's tag"
        );
        assert_eq!(t.get(&k).map(|c| c.tag), Some(3), "still there");
        assert_eq!(t.remove_if(&key(2), |_| true), None, "not in the table");
        assert_eq!(t.remove_if(&k, |c| c.tag == 3).map(|c| c.tag), Some(3));
        assert!(t.get(&k).is_none() && t.is_empty());
    }

    /// A walk by position from the end down, a page at a time, with removals anywhere,
    /// inserts and a retain between its pages, visits every entry that was there from its
    /// start to its end: the promise of [`ConnTable::at`] that the API's listing and the
    /// re-route walk rest on.
    #[test]
    fn a_walk_down_visits_every_entry_there_throughout() {
        let mut x = 777_u32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for round in 0..5_u32 {
            let mut t = ConnTable::new();
            let mut next = 5_000_u32;
            for i in 0..next {
                t.insert(key(i), conn(i));
            }
            let mut throughout: std::collections::HashSet<ConnKey> = (0..next).map(key).collect();
            let mut seen = std::collections::HashSet::new();
            let mut cursor = t.len();
            while cursor > 0 {
                let bottom = cursor.saturating_sub(50);
                for p in (bottom..cursor).rev() {
                    seen.extend(t.at(p).map(|(k, _)| *k));
                }
                cursor = bottom;
                for _ in 0..rnd() % 150 {
                    t.remove(&key(rnd() % next));
                }
                for _ in 0..rnd() % 150 {
                    t.insert(key(next), conn(next));
                    next += 1;
                }
                if rnd() % 8 == 0 {
                    let drop = BackendId((rnd() % 7) as u16);
                    t.retain(|_, c| c.backend != drop || c.created_ms % 3 != 0);
                }
                // (Keys removed are never inserted again.)
                throughout.retain(|k| t.get(k).is_some());
                cursor = cursor.min(t.len());
            }
            let missed = throughout.difference(&seen).count();
            assert_eq!(
                missed,
                0,
                "round {round}: {missed} of {} missed",
                throughout.len()
            );
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
        t.retain(|_, c| c.backend != BackendId(3));
        model.retain(|_, c| c.backend != BackendId(3));
        assert_eq!(t.len(), model.len());
        let mut a: Vec<_> = t.iter().map(|(k, c)| (*k, *c)).collect();
        let mut b: Vec<_> = model.into_iter().collect();
        a.sort_by_key(|e| e.0);
        b.sort_by_key(|e| e.0);
        assert_eq!(a, b);
        for (k, c) in &b {
            assert_eq!(
                t.get(k),
                Some(c),
                "found through the index after the retain"
            );
        }
        assert!(!t.is_empty());
    }

    /// One shard under crafted hashes: keys that all fall in one shard and share their
    /// home slot's low bits, so that they collide in long probe runs that wrap around the
    /// index's end, with removals from the runs' middles (backward shifts) and entries
    /// moved by removals (the store's last), all checked against a model after each step.
    #[test]
    fn shard_probe_runs_and_deletions() {
        let hasher = RandomState::with_seeds(1, 2, 3, 4);
        let mut t = ConnTable::with_hasher(hasher.clone());
        let mut model: HashMap<ConnKey, Conn> = HashMap::new();
        // Found by trying keys until 64 share the shard of the first and the 3 lowest bits
        // of its tag.
        let place = |k: ConnKey| {
            let h = hasher.hash_one(k);
            (h >> (64 - SHARD_BITS), tag(h) & 7)
        };
        let first = place(key(0));
        let keys: Vec<ConnKey> = (0..)
            .map(key)
            .filter(|k| place(*k) == first)
            .take(64)
            .collect();
        let shard_of = |t: &ConnTable| (first.0 as usize, t.shards[first.0 as usize].len);
        let check = |t: &ConnTable, model: &HashMap<ConnKey, Conn>| {
            for k in &keys {
                assert_eq!(t.get(k), model.get(k), "{k:?}");
            }
            let (s, len) = shard_of(t);
            assert_eq!(len, model.len());
            assert_eq!(t.len(), model.len());
            let index = &t.shards[s].index;
            assert!(len * 64 <= index.len().max(1) * 38, "at most 0.59 full");
            assert_eq!(index.iter().filter(|&&s| s != 0).count(), len);
        };
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(t.insert(*k, conn(n as u32)), None);
            model.insert(*k, conn(n as u32));
            check(&t, &model);
        }
        // Remove every third key, from the middles of runs, then re-add some.
        for (n, k) in keys.iter().enumerate().filter(|(n, _)| n % 3 == 1) {
            assert_eq!(t.remove(k), model.remove(k), "remove {n}");
            check(&t, &model);
        }
        for (n, k) in keys.iter().enumerate().filter(|(n, _)| n % 6 == 1) {
            assert_eq!(t.insert(*k, conn(1000 + n as u32)), None);
            model.insert(*k, conn(1000 + n as u32));
            check(&t, &model);
        }
        // Absent keys miss, and removing one changes nothing.
        let absent = key(1 << 30);
        assert_eq!(t.remove(&absent), None);
        check(&t, &model);
        // Everything out, in reverse order.
        for k in keys.iter().rev() {
            assert_eq!(t.remove(k), model.remove(k));
            check(&t, &model);
        }
        let (s, _) = shard_of(&t);
        assert!(
            t.shards[s].index.iter().all(|&s| s == 0),
            "no slot left behind"
        );
        assert!(t.is_empty());
    }

    /// The store is dense in chunks whatever the order of removals, and gives an emptied
    /// chunk back only once the one before it is under half full.
    #[test]
    fn the_store_stays_dense_and_gives_chunks_back() {
        let mut t = ConnTable::new();
        let n = 3 * CHUNK as u32 + 100;
        for i in 0..n {
            t.insert(key(i), conn(i));
        }
        assert_eq!(t.entries.chunks.len(), 4);
        let dense = |t: &ConnTable| {
            let tail = t.len() / CHUNK;
            let c = &t.entries.chunks;
            c.iter().take(tail).all(|c| c.len() == CHUNK)
                && c.iter().skip(tail + 1).all(Vec::is_empty)
                && c.len() <= tail + 2
                && c.iter().map(Vec::len).sum::<usize>() == t.len()
        };
        // From the front: every removal moves the last entry.
        for i in 0..200 {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
            assert!(dense(&t));
        }
        // The fourth chunk emptied, but the third is still over half full: it is kept,
        // and takes the next pushes once the third is full again.
        assert_eq!(t.entries.chunks.len(), 4);
        assert!(t.entries.chunks.last().is_some_and(Vec::is_empty));
        for i in 0..200 {
            assert_eq!(t.insert(key(i), conn(i)), None);
            assert!(dense(&t));
        }
        assert_eq!(t.entries.chunks.last().map(Vec::len), Some(100));
        for i in 0..200 {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        for i in 200..(CHUNK as u32 / 2 + 300) {
            assert_eq!(t.remove(&key(i)), Some(conn(i)));
        }
        assert!(dense(&t));
        assert_eq!(
            t.entries.chunks.len(),
            3,
            "given back under half of the third"
        );
        for i in (CHUNK as u32 / 2 + 300)..n {
            assert_eq!(t.get(&key(i)), Some(&conn(i)), "{i}");
        }
    }

    /// After a flood: a million connections in, all but a thousand out; the table gives
    /// its memory back (index slots and entry capacity), and the rest are still found.
    #[test]
    fn a_drained_table_shrinks() {
        let mut t = ConnTable::new();
        let slots = |t: &ConnTable| t.shards.iter().map(|s| s.index.len()).sum::<usize>();
        let capacity = |t: &ConnTable| t.entries.chunks.iter().map(Vec::capacity).sum::<usize>();
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
