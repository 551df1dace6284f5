//! Stable-toolchain driver for the `controller` fuzz target (`fuzz/`, which needs
//! cargo-fuzz and nightly): deterministic random programs through
//! `flowgate_core::testkit::fuzzing::controller_target`, a hostile switch against the
//! controller core. No program may panic: the core must take any message a switch sends
//! in any order, and send only what encodes and what the switch accepts.
//!
//! A failing program is printed in hex; `FLOWGATE_FUZZ_INPUT=<hex>` runs that one alone.

use std::panic;
use std::time::{Duration, Instant};

use flowgate_core::testkit::fuzzing::controller_target;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex input"))
        .collect()
}

fn run(data: &[u8]) {
    if panic::catch_unwind(|| controller_target(data)).is_err() {
        panic!(
            "this program panics the controller: FLOWGATE_FUZZ_INPUT={}",
            hex(data)
        );
    }
}

#[test]
fn no_program_of_a_hostile_switch_panics_the_controller() {
    if let Ok(h) = std::env::var("FLOWGATE_FUZZ_INPUT") {
        controller_target(&unhex(h.trim()));
        return;
    }
    // Bounded in count and time: a slow (debug, loaded) host runs fewer, never longer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rng = Rng(0x666c_6f77_6761_7465);
    let mut ran = 0u32;
    while ran < 20_000 && Instant::now() < deadline {
        let len = 1 + (rng.next() % 1500) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Skew some programs toward the frames that reach the decisions (steps 1–3):
        // uniform bytes pick them a quarter of the time.
        if ran % 2 == 1 {
            for (i, b) in data.iter_mut().enumerate().skip(2) {
                if i % 29 == 0 {
                    *b = 1 + (*b % 3);
                }
            }
        }
        run(&data);
        ran += 1;
    }
    assert!(ran >= 200, "only {ran} programs ran in 20 s");
    eprintln!("{ran} programs, none panicked");
}
