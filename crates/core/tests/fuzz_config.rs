//! Stable-toolchain driver for the `config` fuzz target (`fuzz/`, nightly): the example
//! configurations (`examples/*.toml`) and the controller target's, mutated line by line
//! and value by value, through `flowgate_core::testkit::fuzzing::config_target`. No text
//! may panic the parser or the controller it configures; a refusal must give reasons.
//!
//! A failing text is printed; `FLOWGATE_FUZZ_CONFIG=<file>` runs that one alone.

use std::panic;
use std::time::{Duration, Instant};

use flowgate_core::testkit::fuzzing::{CONFIGS, Rng, config_target};

/// Values a parser must refuse or take with care: out of range, of the wrong type, not
/// numbers, addresses that are no hosts'.
const HOSTILE: &[&str] = &[
    "0",
    "-1",
    "1",
    "65535",
    "65536",
    "4294967296",
    "18446744073709551616",
    "1e309",
    "nan",
    "inf",
    "-inf",
    "-0.0",
    "0.5",
    "1.5",
    "true",
    "\"\"",
    "\"x\"",
    "[]",
    "[1, \"a\"]",
    "{}",
    "{ a = 1 }",
    "\"10.0.0.999\"",
    "\"300.1.1.1\"",
    "\"::1\"",
    "\"0.0.0.0\"",
    "\"255.255.255.255\"",
    "\"10.0.0.100\"",
    "\"10.0.0.2\"",
    "\"127.0.0.1:0\"",
    "\"round-robin\"",
    "\"isslm\"",
    "\"partitioned\"",
    "\"proactive\"",
    "\"adaptive\"",
    "\"http://10.0.0.2:9100/metrics\"",
    "\"é\"",
    "1979-05-27T07:32:00Z",
];

fn mutate(rng: &mut Rng, base: &str, other: &str) -> String {
    let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
    let others: Vec<&str> = other.lines().collect();
    for _ in 0..1 + rng.below(4) {
        if lines.is_empty() {
            break;
        }
        let i = rng.below(lines.len());
        match rng.below(7) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(rng.below(lines.len() + 1), l);
            }
            2 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            // A line from the other configuration, anywhere: its keys in the wrong table.
            3 if !others.is_empty() => {
                let l = others[rng.below(others.len())].to_owned();
                lines.insert(i, l);
            }
            // A hostile value for a key.
            4 | 5 => {
                if let Some((key, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{key}= {}", HOSTILE[rng.below(HOSTILE.len())]);
                }
            }
            // A byte of the line changed.
            _ => {
                let mut b = lines[i].clone().into_bytes();
                if !b.is_empty() {
                    let k = rng.below(b.len());
                    b[k] = b"[]=\".0 -#\\x\n"[rng.below(12)];
                }
                lines[i] = String::from_utf8_lossy(&b).into_owned();
            }
        }
    }
    lines.join("\n")
}

fn seeds() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let mut v: Vec<String> = ["flowgate.toml", "mininet.toml"]
        .iter()
        .map(|f| {
            let path = format!("{dir}/{f}");
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .collect();
    v.extend(CONFIGS.iter().map(|c| c.to_string()));
    v
}

#[test]
fn no_configuration_text_panics_and_every_refusal_says_why() {
    if let Ok(path) = std::env::var("FLOWGATE_FUZZ_CONFIG") {
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        config_target(&text);
        return;
    }
    let seeds = seeds();
    // The seeds themselves are valid: the mutations start from configurations that work.
    for s in &seeds {
        if let Err(e) = flowgate_core::Config::from_toml(s, &|_| None) {
            panic!("a seed configuration is refused: {e}\n{s}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut rng = Rng(0x636f_6e66_6967_2121);
    let (mut ran, mut accepted) = (0u32, 0u32);
    while ran < 20_000 && Instant::now() < deadline {
        let base = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())];
        let text = mutate(&mut rng, base, other);
        let outcome = panic::catch_unwind(|| config_target(text.as_bytes()));
        if outcome.is_err() {
            panic!("this configuration panics:\n{text}");
        }
        if flowgate_core::Config::from_toml(&text, &|_| None).is_ok() {
            accepted += 1;
        }
        ran += 1;
    }
    assert!(ran >= 200, "only {ran} configurations ran in 15 s");
    // Both sides were reached: mutations the validation refused, and ones it took.
    assert!(
        accepted > 0 && accepted < ran,
        "{accepted} of {ran} accepted"
    );
    eprintln!("{ran} configurations, {accepted} accepted, none panicked");
}
