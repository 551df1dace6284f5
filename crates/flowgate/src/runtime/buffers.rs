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

    /// The buffer given back last (the warmest), or an empty one.
    pub(crate) fn take(&self) -> BytesMut {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.pop().unwrap_or_default()
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
        let got = pool.take();
        assert_eq!((got.as_ptr(), got.len()), (b_ptr, 0));
        assert!(got.capacity() >= 30_000);
        let got = pool.take();
        assert_eq!((got.as_ptr(), got.len()), (a_ptr, 0));
        assert_eq!(pool.take().capacity(), 0, "empty: a new buffer");

        let shared = BytesMut::from(&[3; 20_000][..]).freeze();
        let other = shared.clone();
        pool.give_back(shared);
        assert_eq!(pool.take().capacity(), 0, "still referred to: not kept");
        drop(other);
        pool.give_back(BytesMut::from(&[4; 100][..]).freeze());
        assert_eq!(pool.take().capacity(), 0, "small: not kept");
    }
}
