//! The global controller's spill policy against domain summaries with any numbers in them.
//!
//! Each domain writes its own summary to etcd, and the global controller decides from all
//! of them. A domain with a bug, or one that reports absurd figures (a capacity of 1e306
//! connections a second, a negative load), must not make the decisions unreadable for the
//! others. Each decision is read back the way a domain reads it
//! (`SpillDecision::from_json`), and its figures must be usable: a fraction in (0, 1],
//! target weights in [0, 1] that sum to about 1, finite spare capacities.
//!
//! (It found that a target reporting a capacity over about 1.8e305 got a spare capacity
//! rounded to infinity, written as `null`: a standby global controller taking over could
//! not read that decision back, and dropped the spill it was to keep.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flowgate_coord::spill::{DomainSummary, SpillDecision, SpillParams, SpillPolicy};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Numbers as JSON text: ordinary ones, and the extremes JSON can carry.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "5",
    "40",
    "99.5",
    "100",
    "250",
    "1000",
    "-1",
    "-1e9",
    "1e-300",
    "1e15",
    "1e300",
    "1.7e308",
    "18446744073709551615",
];
const COUNTS: &[&str] = &["0", "1", "2", "3", "4", "18446744073709551615"];

fn summary(rng: &mut Rng, domain: usize) -> String {
    let capacity = match rng.next() % 4 {
        0 => "null".to_string(),
        _ => rng.pick(NUMBERS).to_string(),
    };
    format!(
        r#"{{"services":{{"web":{{"backends":{},"healthy":{},"load_rps":{},"refused_rps":{},"active_connections":{},"capacity_rps":{},"local_backends":[{{"address":"10.0.{domain}.2","mac":"02:00:00:00:0{domain}:02"}},"10.0.{domain}.3"]}}}}}}"#,
        rng.pick(COUNTS),
        rng.pick(COUNTS),
        rng.pick(NUMBERS),
        rng.pick(NUMBERS),
        rng.pick(COUNTS),
        capacity,
    )
}

#[test]
fn any_summaries_give_decisions_every_domain_can_read_and_use() {
    let mut rng = Rng(0x7370_696c_6c21_2121);
    let (mut decided, mut spills) = (0u32, 0u32);
    for _ in 0..300 {
        let mut policy = SpillPolicy::new(SpillParams::default());
        let mut now = Instant::now();
        for _ in 0..20 {
            let mut summaries = BTreeMap::new();
            for d in 1..=4 {
                let text = summary(&mut rng, d);
                let parsed = DomainSummary::from_json(text.as_bytes())
                    .unwrap_or_else(|e| panic!("the test's summary does not parse: {e}: {text}"));
                summaries.insert(format!("d{d}"), parsed);
            }
            for (domain, decision) in policy.decide(&summaries, now) {
                decided += 1;
                let json = decision.to_json();
                let read = SpillDecision::from_json(json.as_bytes()).unwrap_or_else(|e| {
                    panic!("domain {domain} cannot read its decision ({e}): {json}")
                });
                for (svc, s) in &read.services {
                    spills += 1;
                    assert!(
                        s.fraction > 0.0 && s.fraction <= 1.0,
                        "{domain}/{svc}: fraction {}: {json}",
                        s.fraction
                    );
                    let sum: f64 = s.targets.values().map(|t| t.weight).sum();
                    assert!(
                        (sum - 1.0).abs() < 0.01,
                        "{domain}/{svc}: weights sum to {sum}: {json}"
                    );
                    for (t, tg) in &s.targets {
                        assert!(t != &domain, "{domain} spills to itself: {json}");
                        assert!(
                            (0.0..=1.0).contains(&tg.weight) && tg.spare_rps.is_finite(),
                            "{domain}/{svc} -> {t}: {json}"
                        );
                    }
                }
            }
            now += Duration::from_millis(500);
        }
    }
    assert!(
        spills > 0,
        "no domain spilled in {decided} decisions: the test reaches nothing"
    );
    eprintln!("{decided} decisions, {spills} spills, all readable and usable");
}
