//! Feed arbitrarily chunked bytes to the framer and decode each frame.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ofp::fuzzing::framer_target(data);
});
