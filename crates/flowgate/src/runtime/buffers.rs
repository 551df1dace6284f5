//! Write buffers that the session writers hand back once the socket has their bytes, for
//! the core to encode the next batch's answers into.
//!
//! A batch of 256 PACKET_INs is answered with ~120 KB of FLOW_MODs and PACKET_OUTs. Encoded
//! into a fresh allocation each time, every line of it was a store that missed the cache
//! (a sixth of the controller's CPU in the 16-switch bench, stalled on those stores, with
//! page faults besides). The buffer a writer has just written from was last touched by the
//! kernel's copy of it: reused at once, last in first out, it is still in cache.

use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

/// Buffers kept at most: a few batches' worth, shared by every session.
const KEEP: usize = 8;
/// A smaller buffer (an echo reply's) is not worth keeping; a larger one (after a burst
/// of answers) goes back to the allocator.
const MIN_KEPT_CAPACITY: usize = 16 << 10;
const MAX_KEPT_CAPACITY: usize = 4 << 20;

#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<BytesMut>>,
}

impl BufferPool {
    /// Keep `chunk`'s memory if nothing else refers to it.
    pub(crate) fn give_back(&self, chunk: Bytes) {
        let Ok(mut buf) = chunk.try_into_mut() else {
            return;
        };
        if !(MIN_KEPT_CAPACITY..=MAX_KEPT_CAPACITY).contains(&buf.capacity()) {
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < KEEP {
            free.push(buf);
        }
    }

    /// The buffer given back last (the warmest), or a new one large enough to be kept.
    ///
    /// A new buffer used to start empty. Under a light load a batch's answers (a few
    /// hundred bytes a PACKET_IN) then grew it by doubling, each step a new allocation
    /// and a copy, and the few kilobytes it reached were too few to keep: once the pool
    /// held no large buffer, a light load never gave it one, and every batch started
    /// over (in one of three runs at 10,000 setups/s, 914 of the core's 4,110
    /// instructions a PACKET_IN; callgrind, 16 switches).
    pub(crate) fn take(&self) -> BytesMut {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.pop()
            .unwrap_or_else(|| BytesMut::with_capacity(MIN_KEPT_CAPACITY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A written chunk's memory comes back for the next batch (the same allocation, empty),
    /// the last given first; a chunk still referred to elsewhere, or too small to matter,
    /// is not kept.
    #[test]
    fn written_buffers_come_back_last_first() {
        let pool = BufferPool::default();
        let mut a = BytesMut::with_capacity(20_000);
        a.extend_from_slice(&[1; 600]);
        let a_ptr = a.as_ptr();
        let mut b = BytesMut::with_capacity(30_000);
        b.extend_from_slice(&[2; 900]);
        let b_ptr = b.as_ptr();
        pool.give_back(a.freeze());
        pool.give_back(b.freeze());
        let got_b = pool.take();
        assert_eq!((got_b.as_ptr(), got_b.len()), (b_ptr, 0));
        assert!(got_b.capacity() >= 30_000);
        let got_a = pool.take();
        assert_eq!((got_a.as_ptr(), got_a.len()), (a_ptr, 0));
        let fresh = pool.take();
        assert!(
            ![a_ptr, b_ptr].contains(&fresh.as_ptr()) && fresh.is_empty(),
            "empty: a new buffer"
        );

        let shared = BytesMut::from(&[3; 20_000][..]).freeze();
        let shared_ptr = shared.as_ptr();
        let other = shared.clone();
        pool.give_back(shared);
        assert_ne!(
            pool.take().as_ptr(),
            shared_ptr,
            "still referred to: not kept"
        );
        drop(other);
        pool.give_back(BytesMut::from(&[4; 100][..]).freeze());
        assert!(
            pool.take().capacity() >= MIN_KEPT_CAPACITY,
            "small: not kept (a new buffer instead)"
        );
    }

    /// A new buffer is large enough to be kept: a light load's batch, a few hundred bytes
    /// of answers, goes back to the pool once written and the next batch reuses it, where
    /// it used to grow a new buffer from nothing every time.
    #[test]
    fn a_new_buffer_is_kept_however_little_was_written_into_it() {
        let pool = BufferPool::default();
        let mut buf = pool.take();
        assert!(buf.capacity() >= MIN_KEPT_CAPACITY);
        let ptr = buf.as_ptr();
        buf.extend_from_slice(&[5; 530]);
        assert_eq!(buf.as_ptr(), ptr, "no growth for a small batch");
        pool.give_back(buf.freeze());
        assert_eq!(pool.take().as_ptr(), ptr);
    }
}
