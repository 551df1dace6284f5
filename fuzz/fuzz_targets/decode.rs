//! Decode any bytes; if that works, encode and decode again and compare.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ofp::fuzzing::decode_target(data);
});
