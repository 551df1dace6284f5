//! The scenarios (the paper's Cases A, B, C and D) and their parameters.

use serde::Serialize;

/// One controller configuration measured within a scenario (an "arm").
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// Short label used in tables and file names.
    pub label: &'static str,
    /// The `algorithm` key of the service.
    pub algorithm: &'static str,
    /// Which of the paper's cases this arm stands for.
    pub case: &'static str,
}

/// A named scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// `case-a`, `case-b`, `case-c`, `case-d`.
    pub name: &'static str,
    /// One line for `flowgate lab list`.
    pub about: &'static str,
    /// The arms, run one after the other on the same network.
    pub arms: Vec<Arm>,
}

const NONE: Arm = Arm {
    label: "none",
    algorithm: "none",
    case: "A",
};
const ISSLM: Arm = Arm {
    label: "isslm",
    algorithm: "isslm",
    case: "B",
};

/// The overload scenario's arms, in the order they run: the three modes, then the adaptive
/// law without its ceiling (`mode = "adaptive"`, `ceiling = false`).
pub const OVERLOAD_ARMS: [&str; 4] = ["off", "static", "adaptive", NO_CEILING];
/// The arm of the adaptive law alone, without its ceiling: the ablation.
pub const NO_CEILING: &str = "adaptive-no-ceiling";

/// Every scenario, in the order `flowgate lab list` shows them.
pub fn all() -> Vec<Scenario> {
    let d = |label, algorithm| Arm {
        label,
        algorithm,
        case: "D",
    };
    vec![
        Scenario {
            name: "case-a",
            about: "Case A: no server load management; every client addresses server 2 (100.0.0.2), normal then heavy load",
            arms: vec![NONE],
        },
        Scenario {
            name: "case-b",
            about: "Case B: the same load under ISSLM, beside the Case A reference (algorithm none) on the same network",
            arms: vec![NONE, ISSLM],
        },
        Scenario {
            name: "case-c",
            about: "Case C: four domains (switch, clients, one server each), four ISSLM domain controllers, two global controllers, etcd; load 6000/4000/6000/4000",
            arms: ["d1", "d2", "d3", "d4"]
                .into_iter()
                .map(|label| Arm {
                    label,
                    algorithm: "isslm",
                    case: "C",
                })
                .collect(),
        },
        Scenario {
            name: "case-d",
            about: "Case D: ISSLM, DWRS, MRBS, AMLOB, SRT and round robin, each under normal and heavy load",
            arms: vec![
                d("isslm", "isslm"),
                d("dwrs", "dwrs"),
                d("mrbs", "mrbs"),
                d("amlob", "amlob"),
                d("srt", "srt"),
                d("round-robin", "round-robin"),
            ],
        },
        Scenario {
            name: "overload",
            about: "Overload control (ACCM): no gap, the static gap table, the adaptive gap, and the adaptive gap without its ceiling (the ablation; not in --quick) against new connections offered at multiples of a fixed-concurrency pool's capacity",
            arms: OVERLOAD_ARMS
                .into_iter()
                .map(|label| Arm {
                    label,
                    algorithm: "round-robin",
                    case: "overload",
                })
                .collect(),
        },
    ]
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

/// Sizes of a run: the full variant follows the paper, `--quick` is scaled down so a
/// scenario takes under two minutes.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Client hosts (the paper: 30), split between switches s1 and s2.
    pub clients: usize,
    /// Requests of the normal phase (the paper: 200).
    pub normal_requests: u64,
    /// Length of the normal phase in seconds.
    pub normal_secs: f64,
    /// Requests of the heavy phase (the paper: 20,000 in 10 s).
    pub heavy_requests: u64,
    /// Length of the heavy phase in seconds.
    pub heavy_secs: f64,
    /// Server model: service time of every request (ms).
    pub server_delay_ms: u64,
    /// Server model: requests served at once.
    pub server_concurrency: usize,
    /// Server model: requests that may wait for a slot; beyond that 503.
    pub server_queue: usize,
    /// Client timeout per request (ms).
    pub request_timeout_ms: u64,
    /// Longest pause between passes (s), so queues drain and the controller's rate
    /// averages decay.
    pub settle_secs: f64,
    /// Shortest pause between passes (s). When it is below `settle_secs` the pause ends
    /// as soon as every backend's measured request rate (a 1 s average) is below a quarter
    /// of the ISSLM threshold, where it no longer sways any algorithm's choice.
    pub settle_min_secs: f64,
    /// One normal-load baseline for Eqs. 2, 3 and 6, as the paper has: its Cases B and C
    /// use Case A's normal run (100 − 100 · 5.561/6.5 = 14.45, Table 6's 14.44; 5.901/6.5
    /// gives Table 7's 9.21) and Case D one baseline for all algorithms (Table 8: 4.02
    /// Gb/s, 7.02 GB). The normal phase's QoS pass (iperf3) then runs once, with the first
    /// arm (Case B: `none`, the Case A reference), and is every arm's baseline; Case C
    /// takes the normal `all` row for every domain. `false`: each arm's own normal phase.
    pub shared_normal_qos: bool,
}

impl Params {
    /// The paper's sizes (`quick = false`) or the quick ones.
    pub fn new(quick: bool) -> Params {
        if quick {
            Params {
                clients: 8,
                normal_requests: 200,
                normal_secs: 4.0,
                heavy_requests: 2_000,
                heavy_secs: 4.0,
                server_delay_ms: 10,
                server_concurrency: 2,
                server_queue: 32,
                request_timeout_ms: 2_000,
                settle_secs: 2.0,
                settle_min_secs: 0.5,
                shared_normal_qos: false,
            }
        } else {
            Params {
                clients: 30,
                normal_requests: 200,
                normal_secs: 10.0,
                heavy_requests: 20_000,
                heavy_secs: 10.0,
                server_delay_ms: 10,
                server_concurrency: 8,
                server_queue: 64,
                request_timeout_ms: 2_000,
                settle_secs: 3.0,
                settle_min_secs: 3.0,
                shared_normal_qos: false,
            }
        }
    }

    /// The sizes of scenario `name`: [`Params::new`], with the paper's one normal-load
    /// baseline (`shared_normal_qos`) for its cases; and the quick Case D, which runs six
    /// arms where the others run one or two, has 3 s phases instead of 4 at the same rates
    /// (normal 50 req/s, heavy R = 500 req/s, so the same capacity model) to stay under two
    /// minutes.
    pub fn for_scenario(name: &str, quick: bool) -> Params {
        let mut p = Params::new(quick);
        p.shared_normal_qos = matches!(name, "case-a" | "case-b" | "case-c" | "case-d");
        if quick && name == "case-d" {
            p.normal_requests = 150;
            p.normal_secs = 3.0;
            p.heavy_requests = 1_500;
            p.heavy_secs = 3.0;
        }
        p
    }

    /// Capacity of one server, μ = concurrency / service time (requests per second).
    pub fn capacity_rps(&self) -> f64 {
        self.server_concurrency as f64 * 1000.0 / self.server_delay_ms.max(1) as f64
    }

    /// Offered rate of the heavy phase, R (requests per second).
    pub fn heavy_rate(&self) -> f64 {
        self.heavy_requests as f64 / self.heavy_secs
    }

    /// ISSLM's S_Load threshold: 0.75 μ. It must lie in (R/4, μ): below μ so a server is
    /// relieved before it saturates, above R/4 so the four servers at the threshold can
    /// absorb the whole heavy load (else every server is "over" and ISSLM finds no
    /// optimal server). Checked by [`Params::check`].
    pub fn threshold_rps(&self) -> f64 {
        0.75 * self.capacity_rps()
    }

    /// The capacity model's premises: one server cannot carry the heavy load, four can.
    pub fn check(&self) -> Result<(), String> {
        let (mu, r, t) = (self.capacity_rps(), self.heavy_rate(), self.threshold_rps());
        if r <= mu {
            return Err(format!(
                "heavy rate {r} must exceed one server's capacity {mu}"
            ));
        }
        if 4.0 * mu <= r {
            return Err(format!(
                "four servers ({}) must exceed the heavy rate {r}",
                4.0 * mu
            ));
        }
        if t <= r / 4.0 || t >= mu {
            return Err(format!(
                "threshold {t} must lie in (R/4, μ) = ({}, {mu})",
                r / 4.0
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_model_holds_in_both_variants() {
        for quick in [false, true] {
            for sc in all() {
                let p = Params::for_scenario(sc.name, quick);
                assert_eq!(p.check(), Ok(()), "{} quick={quick}", sc.name);
                if quick {
                    // The CI test checks heavy = 10 × normal on the quick Case B.
                    assert_eq!(p.heavy_requests, 10 * p.normal_requests, "{}", sc.name);
                }
                assert!(p.settle_min_secs <= p.settle_secs);
            }
        }
        let (q, d) = (Params::new(true), Params::for_scenario("case-d", true));
        assert_eq!(q.heavy_rate(), d.heavy_rate());
        assert_eq!(Params::new(false).heavy_rate(), 2000.0);
        assert_eq!(Params::new(false).capacity_rps(), 800.0);
    }

    /// The paper's cases compute Eqs. 2, 3 and 6 against one normal baseline, in both
    /// variants.
    #[test]
    fn paper_cases_share_one_normal_baseline() {
        for quick in [false, true] {
            for sc in all() {
                let p = Params::for_scenario(sc.name, quick);
                assert_eq!(p.shared_normal_qos, sc.name != "overload", "{}", sc.name);
            }
        }
    }

    #[test]
    fn scenarios_are_named() {
        let names: Vec<_> = all().iter().map(|s| s.name).collect();
        assert_eq!(names, ["case-a", "case-b", "case-c", "case-d", "overload"]);
        assert_eq!(find("case-d").map(|s| s.arms.len()), Some(6));
    }

    /// The overload scenario lists the arms its run has: the three modes and the adaptive
    /// law without its ceiling.
    #[test]
    fn the_overload_scenario_has_four_arms() {
        let labels: Vec<_> = find("overload")
            .expect("overload")
            .arms
            .iter()
            .map(|a| a.label)
            .collect();
        assert_eq!(labels, ["off", "static", "adaptive", "adaptive-no-ceiling"]);
    }
}
