//! Stable-toolchain driver for the `controller` fuzz target (`fuzz/`, which needs
//! cargo-fuzz and nightly): deterministic programs through
//! `flowgate_core::testkit::fuzzing::controller_target`, a hostile switch against the
//! controller core. A third are uniform random bytes; the rest are the seed programs
//! (`seed_programs`, which reach the decisions) mutated. No program may panic: the core
//! must take any message a switch sends in any order, and send only what encodes and
//! what the switch accepts. The test also checks that the programs reach connections,
//! rule ends, resets and links, so that a driver stuck in the parsers fails.
//!
//! A failing program is printed in hex; `FLOWGATE_FUZZ_INPUT=<hex>` runs that one alone.
//! The seeds are also files in `fuzz/seeds/controller/`, where cargo-fuzz starts from
//! them; `FLOWGATE_WRITE_SEEDS=1` rewrites those files after a change to the seeds.

use std::panic;
use std::time::{Duration, Instant};

use flowgate_core::testkit::fuzzing::{Reached, Rng, controller_target, seed_programs};

/// A few byte-level changes: flips, sets, inserts, deletes, and a splice of another seed.
fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = base.to_vec();
    for _ in 0..1 + rng.next_u64() % 6 {
        let at = (rng.next_u64() % (d.len() as u64 + 1)) as usize;
        match rng.next_u64() % 5 {
            0 if at < d.len() => d[at] ^= 1 << (rng.next_u64() % 8),
            1 if at < d.len() => d[at] = rng.next_u64() as u8,
            2 => d.insert(at, rng.next_u64() as u8),
            3 if at < d.len() => {
                d.remove(at);
            }
            _ => {
                let from = (rng.next_u64() % (other.len() as u64 + 1)) as usize;
                d.truncate(at);
                d.extend_from_slice(&other[from..]);
            }
        }
    }
    d
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex input"))
        .collect()
}

fn run(data: &[u8]) -> Reached {
    match panic::catch_unwind(|| controller_target(data)) {
        Ok(r) => r,
        Err(_) => panic!(
            "this program panics the controller: FLOWGATE_FUZZ_INPUT={}",
            hex(data)
        ),
    }
}

#[test]
fn no_program_of_a_hostile_switch_panics_the_controller() {
    if let Ok(h) = std::env::var("FLOWGATE_FUZZ_INPUT") {
        let reached = controller_target(&unhex(h.trim()));
        eprintln!("{reached:?}");
        return;
    }
    // The seeds as written (one per configuration) reach the decisions on their own.
    let seeds = seed_programs();
    for (config, seed) in seeds.iter().enumerate() {
        let r = run(seed);
        eprintln!("seed of configuration {config}: {r:?}");
        assert!(r.links == 2, "configuration {config}: {r:?}");
        assert!(r.connections > 0, "configuration {config}: {r:?}");
        assert!(r.rules_ended > 0, "configuration {config}: {r:?}");
        assert_eq!(r.reloads, 1, "configuration {config}: {r:?}");
        assert_eq!(r.operations, 2, "configuration {config}: {r:?}");
        // The first and fourth configurations reset a stray segment; the third drops it.
        match config {
            0 | 3 => assert!(r.resets > 0, "configuration {config}: {r:?}"),
            2 => assert_eq!(r.resets, 0, "configuration {config}: {r:?}"),
            _ => {}
        }
    }
    // Bounded in count and time: a slow (debug, loaded) host runs fewer, never longer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rng = Rng(0x666c_6f77_6761_7465);
    let mut ran = 0u32;
    // How many programs got as far as each of these.
    let (mut decided, mut ended, mut reset, mut linked) = (0u32, 0u32, 0u32, 0u32);
    let (mut reloaded, mut operated) = (0u32, 0u32);
    let (mut reported, mut opaque_ended) = (0u32, 0u32);
    while ran < 20_000 && Instant::now() < deadline {
        // A third uniform bytes, two thirds the seeds mutated.
        let data = if ran.is_multiple_of(3) {
            let len = 1 + (rng.next_u64() % 1500) as usize;
            (0..len).map(|_| rng.next_u64() as u8).collect()
        } else {
            let base = &seeds[rng.below(seeds.len())];
            let other = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, base, other)
        };
        let r = run(&data);
        decided += u32::from(r.connections > 0);
        ended += u32::from(r.rules_ended > 0);
        reset += u32::from(r.resets > 0);
        linked += u32::from(r.links > 0);
        reloaded += u32::from(r.reloads > 0 && r.connections > 0);
        operated += u32::from(r.operations > 0 && r.connections > 0);
        reported += u32::from(r.opaque_reported > 0);
        opaque_ended += u32::from(r.opaque_ended > 0);
        ran += 1;
    }
    assert!(ran >= 200, "only {ran} programs ran in 20 s");
    eprintln!(
        "{ran} programs, none panicked; {decided} made connections, {ended} ended rules, \
         {reset} were sent resets, {linked} found links, {reloaded} reloaded with connections, \
         {operated} were operated on with connections, {reported} had conntrack rules \
         reported, {opaque_ended} had conntrack rules end"
    );
    // Random programs must reach the decisions, not only the parsers in front of them.
    for (what, n) in [
        ("made connections", decided),
        ("ended rules", ended),
        ("were sent resets", reset),
        ("found links", linked),
        ("reloaded with connections", reloaded),
        ("were operated on with connections", operated),
        ("had conntrack rules reported", reported),
        ("had conntrack rules end", opaque_ended),
    ] {
        assert!(n > 0, "no program {what} in {ran}");
    }
}

#[test]
fn the_cargo_fuzz_seeds_are_the_seed_programs() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/controller");
    let seeds = seed_programs();
    if std::env::var_os("FLOWGATE_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(dir).expect("seed directory");
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(format!("{dir}/seed-{i}"), s).expect("seed file");
        }
    }
    for (i, s) in seeds.iter().enumerate() {
        let path = format!("{dir}/seed-{i}");
        let file = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            file == *s,
            "{path} is stale: run this test with FLOWGATE_WRITE_SEEDS=1"
        );
    }
}
