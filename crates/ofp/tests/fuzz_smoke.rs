//! Stable-toolchain driver for the fuzz targets in `fuzz/` (which need cargo-fuzz and
//! nightly): the conformance messages plus 200,000 deterministic mutations of them (bit
//! flips, byte sets, truncations, splices, inserted/deleted bytes, length-field edits),
//! each through `ofp::fuzzing::decode_target` and `framer_target`. No input may panic,
//! and whatever decodes must re-encode to the same bytes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

fn corpus() -> Vec<Vec<u8>> {
    let dir = std::env::var_os("FLOWGATE_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ryu-of13"))
        });
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "packet"))
        .filter_map(|p| std::fs::read(p).ok())
        .collect();
    v.sort();
    assert!(!v.is_empty());
    v
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = [0, 0xff, 0x7f, 0x80, 1, 8, rng.next() as u8][rng.below(7)];
            }
            2 => d.truncate(rng.below(d.len() + 1)),
            3 => {
                let cut = rng.below(d.len() + 1);
                let from = rng.below(other.len() + 1);
                d.truncate(cut);
                d.extend_from_slice(&other[from..]);
            }
            4 => {
                let i = rng.below(d.len() + 1);
                d.insert(i, rng.next() as u8);
            }
            5 if !d.is_empty() => {
                let i = rng.below(d.len());
                d.remove(i);
            }
            6 if d.len() >= 2 => {
                // Edit some inner 16-bit length-like field.
                let i = rng.below(d.len() - 1);
                let v = [0u16, 1, 4, 7, 8, 9, 16, 0xfff8, 0xffff, rng.next() as u16][rng.below(10)];
                d[i..i + 2].copy_from_slice(&v.to_be_bytes());
            }
            _ => {}
        }
    }
    // Usually keep the header's length consistent so the body parsers are exercised.
    if d.len() >= 4 && rng.below(4) != 0 {
        let l = (d.len().min(65_535) as u16).to_be_bytes();
        d[2..4].copy_from_slice(&l);
    }
    d
}

fn run(data: &[u8]) {
    let r = std::panic::catch_unwind(|| {
        ofp::fuzzing::decode_target(data);
        ofp::fuzzing::framer_target(data);
    });
    if let Err(e) = r {
        eprintln!(
            "panicking input ({} bytes): {}",
            data.len(),
            data.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        std::panic::resume_unwind(e);
    }
}

#[test]
fn fuzz_targets_survive_mutated_conformance_inputs() {
    let corpus = corpus();
    for c in &corpus {
        run(c);
    }
    let mut rng = Rng(0x5eed_f10a_9a7e_0001);
    let start = Instant::now();
    let budget = Duration::from_secs(18);
    let mut n = 0usize;
    let mut decoded = 0usize;
    while n < 200_000 && start.elapsed() < budget {
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let d = mutate(&mut rng, base, other);
        if ofp::decode(bytes::Bytes::copy_from_slice(&d)).is_ok() {
            decoded += 1;
        }
        run(&d);
        n += 1;
    }
    println!(
        "fuzz smoke: {} corpus files, {n} mutations ({decoded} still decoded) in {:.1?}",
        corpus.len(),
        start.elapsed()
    );
    assert!(n >= 20_000, "only {n} mutations ran in the time budget");
}
