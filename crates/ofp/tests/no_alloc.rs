//! The PACKET_IN → 2×FLOW_MOD + PACKET_OUT path performs no heap allocation in the codec
//! (docs/architecture.md). A counting global allocator watches this thread.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;

#[path = "common/roundtrip.rs"]
mod roundtrip;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static WATCH: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if WATCH.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn packet_in_to_flow_mods_and_packet_out_allocates_nothing() {
    let frame = roundtrip::packet_in_bytes();
    let mut out = BytesMut::with_capacity(4096);
    // Warm-up: the first clone of a Vec-backed `Bytes` promotes it to shared storage once.
    let n = roundtrip::round_trip(&frame, &mut out);
    assert!(n > 300, "wrote {n} bytes");
    for _ in 0..10 {
        roundtrip::round_trip(&frame, &mut out);
    }
    ALLOCS.store(0, Ordering::Relaxed);
    WATCH.with(|w| w.set(true));
    for _ in 0..1000 {
        std::hint::black_box(roundtrip::round_trip(
            std::hint::black_box(&frame),
            &mut out,
        ));
    }
    WATCH.with(|w| w.set(false));
    let n = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(n, 0, "{n} heap allocations in 1000 round trips");
    // The counter itself works.
    WATCH.with(|w| w.set(true));
    std::hint::black_box(Vec::<u8>::with_capacity(16));
    WATCH.with(|w| w.set(false));
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        1,
        "the counting allocator did not see an allocation"
    );
    // The three messages are valid and decode back.
    let msgs = ofp::decode_file_bytes(&out).expect("decode output");
    assert_eq!(msgs.len(), 3);
}

/// The borrowed views over the answer (two FLOW_MODs and a PACKET_OUT), over the forward
/// rule's FLOW_REMOVED and over the PACKET_IN itself, walked field by field and action by
/// action, allocate nothing either.
#[test]
fn views_of_flow_mods_and_packet_out_allocate_nothing() {
    let mut out = BytesMut::with_capacity(4096);
    roundtrip::round_trip(&roundtrip::packet_in_bytes(), &mut out);
    let mut frames = Vec::new();
    let mut rest = &out[..];
    while let Some(h) = rest.get(..ofp::HEADER_LEN) {
        let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let (f, r) = rest.split_at(len);
        frames.push(f);
        rest = r;
    }
    assert_eq!(frames.len(), 3);
    // And the FLOW_REMOVED of the forward rule, when its connection ends.
    let removed = ofp::decode(bytes::Bytes::copy_from_slice(frames[0]))
        .ok()
        .and_then(|(_, m)| match m {
            ofp::Message::FlowMod(fm) => Some(ofp::Message::FlowRemoved(
                ofp::FlowRemoved::of_rule(&fm, ofp::FlowRemovedReason::IdleTimeout, 12, 9, 900),
            )),
            _ => None,
        })
        .expect("the first answer is a FLOW_MOD");
    let mut removed_frame = BytesMut::new();
    ofp::encode(7, &removed, &mut removed_frame).expect("encode FLOW_REMOVED");
    frames.push(&removed_frame[..]);
    // And the PACKET_IN the answer is for.
    let packet_in = roundtrip::packet_in_bytes();
    frames.push(&packet_in[..]);
    let walk = |f: &[u8]| -> usize {
        if let Ok(pi) = ofp::PacketInView::new(f) {
            pi.match_fields().count() + pi.in_port().map_or(0, |p| p as usize) + pi.data().len()
        } else if let Ok(fr) = ofp::FlowRemovedView::new(f) {
            fr.match_fields().map(|o| o.payload().len()).sum::<usize>()
                + usize::from(fr.packet_count() == 9)
        } else if let Ok(fm) = ofp::FlowModView::new(f) {
            fm.match_fields().map(|o| o.payload().len()).sum::<usize>()
                + fm.actions().filter_map(|a| a.output()).count()
        } else if let Ok(po) = ofp::PacketOutView::new(f) {
            po.actions().filter_map(|a| a.set_field()).count() + po.data().len()
        } else {
            panic!("not a FLOW_MOD, PACKET_OUT, FLOW_REMOVED or PACKET_IN")
        }
    };
    ALLOCS.store(0, Ordering::Relaxed);
    WATCH.with(|w| w.set(true));
    let mut seen = 0;
    for _ in 0..1000 {
        for f in &frames {
            seen += walk(std::hint::black_box(f));
        }
    }
    WATCH.with(|w| w.set(false));
    let n = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(n, 0, "{n} heap allocations in 1000 walks");
    assert!(seen > 1000 * 4 * 8, "the views yielded too little: {seen}");
}
