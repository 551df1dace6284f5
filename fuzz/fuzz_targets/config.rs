#![no_main]
//! Any text as a configuration: `flowgate_core::testkit::fuzzing::config_target`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flowgate_core::testkit::fuzzing::config_target(data);
});
