#![no_main]
//! A hostile switch against the controller core: `flowgate_core::testkit::fuzzing`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = flowgate_core::testkit::fuzzing::controller_target(data);
});
