//! The global controller's spill policy: from the domains' summaries, where each overloaded
//! domain sends part of its new connections, and with what weights. Pure: no I/O, the
//! caller passes the clock. The runtime (flowgate's `runtime::cluster`) reads the
//! summaries from the store, calls [`SpillPolicy::decide`] every `summary_interval_ms`,
//! and writes the decisions (fenced) where the domains read them.
//!
//! What it guarantees (docs/distributed.md, "Spill protocol"):
//!
//! - **Hysteresis.** A domain's service enters spill at `load >= threshold × capacity` (or
//!   with no healthy local backend while it has demand: a domain starting up, backends not
//!   located yet and no clients, is not in spill) and leaves only after its load stayed
//!   below `exit_threshold × capacity` (and something is healthy) for `hold`. A domain
//!   hovering at its threshold keeps a steady spill instead of flapping in and out.
//! - **Stable fractions.** A published fraction or weight changes at once only by at least
//!   `step`, or when the old decision would overfill a target; smaller drifts wait for
//!   `hold` since the last change.
//! - **Accounting.** A target's spare capacity is `threshold × capacity − its own demand −
//!   what other domains' decisions already send it` (Σ fraction × source load × weight):
//!   two overloaded domains do not both fill the same target. The spilled load (fraction ×
//!   load) never exceeds the targets' summed spare capacity, except for a domain with no
//!   healthy backend, which sends everything (to targets with spare capacity): there,
//!   anything kept would fail.
//! - **Health.** A target has healthy backends only (none unhealthy, none ejected, even
//!   while its pool's panic threshold waives the ejection), a known capacity, is below its
//!   threshold and is not spilling itself.
//!
//! A summary's `load_rps` is the domain's *demand*: every new connection its controller
//! assigned, spilled ones included. So spilling does not lower it, and a spill does not
//! undo itself; the hysteresis compares demand with capacity.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Below this a spill would move nothing worth a decision.
const MIN_USEFUL_FRACTION: f64 = 0.005;
/// A target with less than this share of the summed spare capacity is left out.
const MIN_TARGET_SHARE: f64 = 0.01;
/// The least an overloaded domain spills (its load may hover just above its threshold).
pub const MIN_FRACTION: f64 = 0.1;

/// The policy's knobs (`[cluster]` in the config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpillParams {
    /// Enter spill at load ≥ `threshold` × capacity.
    pub threshold: f64,
    /// Leave spill once load < `exit_threshold` × capacity for `hold`.
    pub exit_threshold: f64,
    pub hold: Duration,
    /// A fraction or weight change smaller than this waits for `hold`.
    pub step: f64,
}

impl Default for SpillParams {
    fn default() -> Self {
        SpillParams {
            threshold: 1.0,
            exit_threshold: 0.8,
            hold: Duration::from_secs(2),
            step: 0.05,
        }
    }
}

/// A backend as a domain reports it (`{"address", "mac"}`; a bare address string is
/// accepted too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendRef {
    pub address: String,
    pub mac: Option<String>,
}

impl<'de> Deserialize<'de> for BackendRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Bare(String),
            Full {
                address: String,
                #[serde(default)]
                mac: Option<String>,
            },
        }
        Ok(match Form::deserialize(d)? {
            Form::Bare(address) => BackendRef { address, mac: None },
            Form::Full { address, mac } => BackendRef { address, mac },
        })
    }
}

/// One service of a domain's summary (`/flowgate/<cluster>/domain/<d>/summary`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServiceSummary {
    /// Local backends (located on the domain's own switches).
    #[serde(default)]
    pub backends: u64,
    /// Local backends that are eligible (healthy, not ejected, or ejected while the pool's
    /// panic threshold waives it: they take the domain's own connections).
    #[serde(default)]
    pub healthy: u64,
    /// Local backends that passive outlier detection has ejected, waived or not.
    #[serde(default)]
    pub ejected: u64,
    /// The domain's demand: new connections/s its controller assigned, spilled included,
    /// plus those it refused for want of a backend.
    #[serde(default)]
    pub load_rps: f64,
    /// Of which refused (information).
    #[serde(default)]
    pub refused_rps: f64,
    #[serde(default)]
    pub active_connections: u64,
    /// `threshold_rps` × healthy local backends; none without `threshold_rps`.
    #[serde(default)]
    pub capacity_rps: Option<f64>,
    /// The healthy local backends, for the domains that spill here.
    #[serde(default)]
    pub local_backends: Vec<BackendRef>,
}

impl ServiceSummary {
    /// Demand, with garbage (NaN, negative) read as zero.
    fn load(&self) -> f64 {
        if self.load_rps.is_finite() {
            self.load_rps.max(0.0)
        } else {
            0.0
        }
    }

    /// A usable capacity: finite and positive.
    fn capacity(&self) -> Option<f64> {
        self.capacity_rps.filter(|c| c.is_finite() && *c > 0.0)
    }

    fn unhealthy(&self) -> u64 {
        self.backends.saturating_sub(self.healthy)
    }
}

/// A domain's summary, as its master publishes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct DomainSummary {
    #[serde(default)]
    pub services: BTreeMap<String, ServiceSummary>,
}

impl DomainSummary {
    pub fn from_json(bytes: &[u8]) -> Result<DomainSummary, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// One target of a spill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpillTarget {
    /// Share of the spilled connections (the targets' weights sum to 1).
    pub weight: f64,
    /// The target's spare capacity when the weights were set (information).
    #[serde(default)]
    pub spare_rps: f64,
    /// The target's healthy backends (address, MAC), as it reported them.
    #[serde(default)]
    pub backends: Vec<BackendRef>,
}

/// Where one service of a domain spills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceSpill {
    /// Share of the domain's new connections sent to other domains.
    pub fraction: f64,
    #[serde(default)]
    pub targets: BTreeMap<String, SpillTarget>,
}

/// A domain's spill decision (`/flowgate/<cluster>/spill/<d>`): the JSON the domains read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpillDecision {
    #[serde(default)]
    pub services: BTreeMap<String, ServiceSpill>,
}

impl SpillDecision {
    pub fn from_json(bytes: &[u8]) -> Result<SpillDecision, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    pub fn to_json(&self) -> String {
        // Maps and plain numbers only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| "{\"services\":{}}".into())
    }
}

/// What the policy remembers per (domain, service).
#[derive(Debug, Clone, Default)]
struct State {
    /// In spill (entered at the threshold, not yet out through the exit threshold).
    active: bool,
    /// Since when the load has been below the exit threshold (while active).
    below_since: Option<Instant>,
    /// The published decision (fraction 0 = none).
    fraction: f64,
    targets: BTreeMap<String, SpillTarget>,
    changed_at: Option<Instant>,
}

/// The global controller's spill policy, with memory (see the module's doc).
#[derive(Debug, Clone)]
pub struct SpillPolicy {
    params: SpillParams,
    state: BTreeMap<(String, String), State>,
}

fn service_of<'a>(
    summaries: &'a BTreeMap<String, DomainSummary>,
    domain: &str,
    service: &str,
) -> Option<&'a ServiceSummary> {
    summaries.get(domain)?.services.get(service)
}

/// `x` to three decimals; a figure too large for that (a domain may report any capacity)
/// as it is, since an infinity would be written as JSON `null`, which no reader of the
/// decision takes as a number.
fn round3(x: f64) -> f64 {
    let r = (x * 1000.0).round() / 1000.0;
    if r.is_finite() { r } else { x }
}

impl SpillPolicy {
    pub fn new(params: SpillParams) -> SpillPolicy {
        SpillPolicy {
            params,
            state: BTreeMap::new(),
        }
    }

    pub fn params(&self) -> SpillParams {
        self.params
    }

    pub fn set_params(&mut self, params: SpillParams) {
        self.params = params;
    }

    /// Start from a decision already in force (a newly elected global controller reads
    /// them from the store), so a failover does not reset every spill. A seeded spill
    /// is held like any other: it ends only through the exit threshold and the hold.
    pub fn seed(&mut self, domain: &str, decision: &SpillDecision, now: Instant) {
        for (svc, s) in &decision.services {
            if !(s.fraction.is_finite() && s.fraction > 0.0) || s.targets.is_empty() {
                continue;
            }
            self.state.insert(
                (domain.to_string(), svc.clone()),
                State {
                    active: true,
                    below_since: None,
                    fraction: s.fraction.min(1.0),
                    targets: s.targets.clone(),
                    changed_at: Some(now),
                },
            );
        }
    }

    /// Is this domain's service in spill (between entry and exit)?
    pub fn is_active(&self, domain: &str, service: &str) -> bool {
        self.state
            .get(&(domain.to_string(), service.to_string()))
            .is_some_and(|s| s.active)
    }

    /// Every domain's decision (an empty one for a domain that does not spill), from the
    /// summaries of the domains alive now.
    pub fn decide(
        &mut self,
        summaries: &BTreeMap<String, DomainSummary>,
        now: Instant,
    ) -> BTreeMap<String, SpillDecision> {
        let p = self.params;
        // Forget domains and services that are gone (their summary lapsed with their lease).
        self.state.retain(|(d, s), _| {
            summaries
                .get(d)
                .is_some_and(|ds| ds.services.contains_key(s))
        });

        // 1. Hysteresis: who is in spill.
        for (d, ds) in summaries {
            for (svc, s) in &ds.services {
                let st = self.state.entry((d.clone(), svc.clone())).or_default();
                let load = s.load();
                // Nothing healthy matters only with demand: a domain whose backends are not
                // located yet (startup) and that has no clients is not in spill, and so
                // stays a target as soon as its backends are up.
                let dead = s.healthy == 0 && load > 0.0;
                let enter = dead || s.capacity().is_some_and(|c| load >= p.threshold * c);
                let stay = dead || s.capacity().is_some_and(|c| load >= p.exit_threshold * c);
                if enter {
                    st.active = true;
                }
                if st.active {
                    if stay {
                        st.below_since = None;
                    } else {
                        let since = *st.below_since.get_or_insert(now);
                        if now.saturating_duration_since(since) >= p.hold {
                            st.active = false;
                            st.below_since = None;
                        }
                    }
                }
            }
        }

        // 2. What the published decisions already send each target: Σ f × load × weight.
        let mut inflow: BTreeMap<(String, String), f64> = BTreeMap::new();
        for ((d, svc), st) in &self.state {
            let load = service_of(summaries, d, svc).map_or(0.0, ServiceSummary::load);
            for (t, tg) in &st.targets {
                *inflow.entry((t.clone(), svc.clone())).or_default() +=
                    st.fraction * load * tg.weight;
            }
        }

        // 3. Each domain's service in turn (a fixed order): propose, then publish if the
        //    change is worth it.
        let keys: Vec<(String, String)> = self.state.keys().cloned().collect();
        for key in keys {
            let (d, svc) = &key;
            // Every remaining state has its summary (retained above).
            let Some(s) = service_of(summaries, d, svc) else {
                continue;
            };
            let load = s.load();
            let Some(st) = self.state.get(&key) else {
                continue;
            };
            let (active, old_f, old_targets) = (st.active, st.fraction, st.targets.clone());
            // Our own contribution does not count against our targets.
            for (t, tg) in &old_targets {
                if let Some(x) = inflow.get_mut(&(t.clone(), svc.clone())) {
                    *x -= old_f * load * tg.weight;
                }
            }
            let (spare, proposal) = if active {
                self.propose(d, svc, s, summaries, &inflow)
            } else {
                (BTreeMap::new(), None)
            };
            let publish = match &proposal {
                None => old_f > 0.0,
                Some((f, targets)) => {
                    let Some(st) = self.state.get(&key) else {
                        continue;
                    };
                    // Nothing healthy: the spill is all of the demand, not capped by
                    // the targets' room, so room alone is no reason to rewrite it.
                    let capped = s.healthy > 0;
                    self.worth_publishing(st, *f, targets, &spare, load, capped, now)
                }
            };
            let Some(st) = self.state.get_mut(&key) else {
                continue;
            };
            if publish {
                match proposal {
                    Some((f, targets)) => {
                        st.fraction = f;
                        st.targets = targets;
                    }
                    None => {
                        st.fraction = 0.0;
                        st.targets.clear();
                    }
                }
                st.changed_at = Some(now);
            }
            for (t, tg) in &st.targets {
                *inflow.entry((t.clone(), svc.clone())).or_default() +=
                    st.fraction * load * tg.weight;
            }
        }

        // 4. The decisions, one per live domain.
        let mut out: BTreeMap<String, SpillDecision> = summaries
            .keys()
            .map(|d| (d.clone(), SpillDecision::default()))
            .collect();
        for ((d, svc), st) in &self.state {
            if st.fraction > 0.0
                && !st.targets.is_empty()
                && let Some(dec) = out.get_mut(d)
            {
                dec.services.insert(
                    svc.clone(),
                    ServiceSpill {
                        fraction: st.fraction,
                        targets: st.targets.clone(),
                    },
                );
            }
        }
        out
    }

    /// The decision this domain's service would get now: the targets' spare capacities,
    /// and the fraction with the targets (none when there is nowhere to spill).
    #[allow(clippy::type_complexity)]
    fn propose(
        &self,
        d: &str,
        svc: &str,
        s: &ServiceSummary,
        summaries: &BTreeMap<String, DomainSummary>,
        inflow: &BTreeMap<(String, String), f64>,
    ) -> (
        BTreeMap<String, f64>,
        Option<(f64, BTreeMap<String, SpillTarget>)>,
    ) {
        let p = self.params;
        let mut spare: BTreeMap<String, f64> = BTreeMap::new();
        for (t, ts) in summaries {
            if t == d || self.is_active(t, svc) {
                continue;
            }
            let Some(o) = ts.services.get(svc) else {
                continue;
            };
            let Some(cap) = o.capacity() else {
                continue; // Unknown capacity: nothing to account against.
            };
            if o.healthy == 0 || o.unhealthy() > 0 || o.ejected > 0 || o.load() >= p.threshold * cap
            {
                continue;
            }
            let already = inflow
                .get(&(t.clone(), svc.to_string()))
                .copied()
                .unwrap_or(0.0)
                .max(0.0);
            let room = p.threshold * cap - o.load() - already;
            if room > 0.0 {
                spare.insert(t.clone(), room);
            }
        }
        // A target with a sliver of room would get a weight of about 0: not worth naming.
        let sum: f64 = spare.values().sum();
        spare.retain(|_, room| *room >= MIN_TARGET_SHARE * sum);
        let total: f64 = spare.values().sum();
        let load = s.load();
        let wanted = match s.capacity() {
            _ if s.healthy == 0 => 1.0,
            Some(c) if load > 0.0 => ((load - p.threshold * c) / load).clamp(MIN_FRACTION, 1.0),
            _ => MIN_FRACTION,
        };
        let fraction = if s.healthy == 0 {
            wanted
        } else if load > 0.0 {
            wanted.min(total / load)
        } else {
            0.0
        };
        let fraction = round3(fraction);
        if total <= 0.0 || fraction < MIN_USEFUL_FRACTION {
            return (spare, None);
        }
        let targets = spare
            .iter()
            .map(|(t, room)| {
                let backends = service_of(summaries, t, svc)
                    .map(|s| s.local_backends.clone())
                    .unwrap_or_default();
                (
                    t.clone(),
                    SpillTarget {
                        weight: round3(room / total),
                        spare_rps: round3(*room),
                        backends,
                    },
                )
            })
            .collect();
        (spare, Some((fraction, targets)))
    }

    /// Publish a proposal now, or keep the decision in force (to not flap)?
    #[allow(clippy::too_many_arguments)]
    fn worth_publishing(
        &self,
        st: &State,
        f: f64,
        targets: &BTreeMap<String, SpillTarget>,
        spare: &BTreeMap<String, f64>,
        load: f64,
        capped: bool,
        now: Instant,
    ) -> bool {
        let p = self.params;
        if st.fraction <= 0.0 || st.targets.is_empty() {
            return true; // Entering spill: at once.
        }
        // The decision in force would overfill a target, or names one that is no longer
        // one (full, failing, spilling itself): correct it at once. The small slack
        // absorbs rounding.
        for (t, tg) in &st.targets {
            let Some(room) = spare.get(t) else {
                return true;
            };
            if capped && st.fraction * load * tg.weight > room * 1.001 + 1e-9 {
                return true;
            }
            if targets.get(t).is_some_and(|n| n.backends != tg.backends) {
                return true;
            }
        }
        let dw = targets
            .iter()
            .map(|(t, n)| (n.weight - st.targets.get(t).map_or(0.0, |o| o.weight)).abs())
            .fold(0.0, f64::max);
        let df = (f - st.fraction).abs();
        if df >= p.step - 1e-9 || dw >= p.step - 1e-9 {
            return true;
        }
        let changed = df > 0.0 || dw > 0.0 || targets.len() != st.targets.len();
        changed
            && st
                .changed_at
                .is_none_or(|t| now.saturating_duration_since(t) >= p.hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(healthy: u64, load: f64, cap: f64, backend: &str) -> ServiceSummary {
        ServiceSummary {
            backends: healthy,
            healthy,
            ejected: 0,
            load_rps: load,
            refused_rps: 0.0,
            active_connections: 0,
            capacity_rps: Some(cap),
            local_backends: vec![BackendRef {
                address: backend.into(),
                mac: Some("02:00:00:00:00:01".into()),
            }],
        }
    }

    fn summaries(list: &[(&str, ServiceSummary)]) -> BTreeMap<String, DomainSummary> {
        list.iter()
            .map(|(d, s)| {
                (
                    d.to_string(),
                    DomainSummary {
                        services: [("web".to_string(), s.clone())].into(),
                    },
                )
            })
            .collect()
    }

    /// d1 (backend `a`, capacity 100 rps) at `load` beside d2 (backend `b`) at `d2_load` of
    /// `d2_cap`: the two-domain setting most tests vary.
    fn pair(load: f64, d2_load: f64, d2_cap: f64) -> BTreeMap<String, DomainSummary> {
        summaries(&[
            ("d1", svc(1, load, 100.0, "a")),
            ("d2", svc(1, d2_load, d2_cap, "b")),
        ])
    }

    fn web(d: &BTreeMap<String, SpillDecision>, dom: &str) -> Option<ServiceSpill> {
        d.get(dom).and_then(|x| x.services.get("web").cloned())
    }

    fn policy() -> SpillPolicy {
        SpillPolicy::new(SpillParams::default())
    }

    #[test]
    fn an_overloaded_domain_spills_by_spare_capacity() {
        let mut p = policy();
        let s = summaries(&[
            ("d1", svc(1, 200.0, 100.0, "10.0.0.11")),
            ("d2", svc(1, 20.0, 100.0, "10.0.0.12")),
            ("d3", svc(1, 60.0, 100.0, "10.0.0.13")),
            ("d4", svc(0, 0.0, 0.0, "10.0.0.14")),
        ]);
        let d = p.decide(&s, Instant::now());
        let w = web(&d, "d1").expect("d1 spills");
        assert_eq!(w.fraction, 0.5);
        assert_eq!(w.targets["d2"].weight, 0.667);
        assert_eq!(w.targets["d3"].weight, 0.333);
        assert!(!w.targets.contains_key("d4"), "nothing healthy: no target");
        assert!(d["d2"].services.is_empty());
    }

    #[test]
    fn the_json_is_what_the_domains_read() {
        let summary = br#"{"instance":"d1a","at_unix_ms":1,"services":{"web":{"backends":1,"healthy":1,"load_rps":200.0,"active_connections":3,"capacity_rps":100.0,"local_backends":[{"address":"10.0.0.11","mac":"02:00:00:00:00:11"}]}}}"#;
        let other = br#"{"services":{"web":{"backends":1,"healthy":1,"load_rps":0.0,"capacity_rps":100.0,"local_backends":["10.0.0.12"]}}}"#;
        let mut s = BTreeMap::new();
        s.insert(
            "d1".to_string(),
            DomainSummary::from_json(summary).expect("summary parses"),
        );
        s.insert(
            "d2".to_string(),
            DomainSummary::from_json(other).expect("bare addresses parse"),
        );
        let d = policy().decide(&s, Instant::now());
        let v: serde_json::Value =
            serde_json::from_str(&d["d1"].to_json()).expect("decision is JSON");
        let web = &v["services"]["web"];
        assert_eq!(web["fraction"], 0.5);
        assert_eq!(web["targets"]["d2"]["weight"], 1.0);
        assert_eq!(web["targets"]["d2"]["backends"][0]["address"], "10.0.0.12");
        assert_eq!(d["d2"].to_json(), r#"{"services":{}}"#);
        // Round trip: what the store holds seeds a new global controller.
        let back = SpillDecision::from_json(d["d1"].to_json().as_bytes()).expect("parses");
        assert_eq!(back, d["d1"]);
    }

    #[test]
    fn hovering_at_the_threshold_does_not_flap() {
        let mut p = policy();
        let t0 = Instant::now();
        let mut seen = Vec::new();
        // Load oscillates 95..105 % of capacity every 200 ms for 20 s.
        for i in 0..100u64 {
            let load = if i % 2 == 0 { 105.0 } else { 95.0 };
            let s = pair(load, 10.0, 100.0);
            let d = p.decide(&s, t0 + Duration::from_millis(200 * i));
            seen.push(web(&d, "d1").map(|w| w.fraction));
        }
        assert!(seen.iter().all(|f| *f == Some(MIN_FRACTION)), "{seen:?}");
    }

    #[test]
    fn leaves_only_below_the_exit_threshold_for_the_hold() {
        let mut p = policy();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let s = |load: f64| pair(load, 0.0, 100.0);
        assert!(web(&p.decide(&s(150.0), at(0)), "d1").is_some());
        // Below the entry threshold, above the exit one: still spilling.
        assert!(web(&p.decide(&s(85.0), at(500)), "d1").is_some());
        // Below the exit threshold, but not for the hold yet.
        assert!(web(&p.decide(&s(50.0), at(1000)), "d1").is_some());
        assert!(web(&p.decide(&s(50.0), at(2500)), "d1").is_some());
        // Back up in between resets the clock.
        assert!(web(&p.decide(&s(90.0), at(2700)), "d1").is_some());
        assert!(web(&p.decide(&s(50.0), at(3000)), "d1").is_some());
        assert!(web(&p.decide(&s(50.0), at(4900)), "d1").is_some());
        assert!(web(&p.decide(&s(50.0), at(5000)), "d1").is_none());
        assert!(!p.is_active("d1", "web"));
        // And re-enters only at the entry threshold.
        assert!(web(&p.decide(&s(95.0), at(5200)), "d1").is_none());
        assert!(web(&p.decide(&s(100.0), at(5400)), "d1").is_some());
    }

    #[test]
    fn small_changes_wait_for_the_hold_big_ones_do_not() {
        let mut p = policy();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let s = |load: f64| pair(load, 0.0, 1000.0);
        let f = |d: &BTreeMap<String, SpillDecision>| web(d, "d1").map(|w| w.fraction);
        assert_eq!(f(&p.decide(&s(200.0), at(0))), Some(0.5));
        // 0.5 → 0.524: under the 5-point step, held.
        assert_eq!(f(&p.decide(&s(210.0), at(200))), Some(0.5));
        assert_eq!(f(&p.decide(&s(210.0), at(1800))), Some(0.5));
        // After the hold it follows.
        assert_eq!(f(&p.decide(&s(210.0), at(2000))), Some(0.524));
        // 0.524 → 0.6: a step, at once.
        assert_eq!(f(&p.decide(&s(250.0), at(2200))), Some(0.6));
    }

    #[test]
    fn two_overloaded_domains_do_not_fill_the_same_target() {
        let mut p = policy();
        // d3 has 100 rps spare; d1 and d2 each want to spill 100.
        let s = summaries(&[
            ("d1", svc(1, 200.0, 100.0, "a")),
            ("d2", svc(1, 200.0, 100.0, "b")),
            ("d3", svc(1, 0.0, 100.0, "c")),
        ]);
        let d = p.decide(&s, Instant::now());
        let spilled = |dom: &str| web(&d, dom).map_or(0.0, |w| w.fraction * 200.0);
        let total = spilled("d1") + spilled("d2");
        assert!(total <= 100.0 + 0.5, "d3 overfilled: {total} rps, {d:?}");
        assert!(spilled("d1") > 0.0, "{d:?}");
        // Next round, with the same summaries: still within d3's spare capacity (the
        // decisions in force are accounted, not counted twice or forgotten).
        let d = p.decide(&s, Instant::now() + Duration::from_millis(200));
        let spilled = |dom: &str| web(&d, dom).map_or(0.0, |w| w.fraction * 200.0);
        assert!(spilled("d1") + spilled("d2") <= 100.5, "{d:?}");
    }

    #[test]
    fn the_fraction_is_capped_by_the_targets_spare_capacity() {
        let mut p = policy();
        // d1 wants to spill 300 of 400 rps; d2 has 50 spare.
        let s = pair(400.0, 50.0, 100.0);
        let w = web(&p.decide(&s, Instant::now()), "d1").expect("spills");
        assert_eq!(w.fraction, 0.125);
        // Its spare shrinks: the decision in force would overfill it, corrected at once
        // (although the change is under the step).
        let s = pair(400.0, 70.0, 100.0);
        let w = web(
            &p.decide(&s, Instant::now() + Duration::from_millis(200)),
            "d1",
        )
        .expect("spills");
        assert_eq!(w.fraction, 0.075);
    }

    #[test]
    fn failing_or_full_domains_are_no_targets() {
        let mut p = policy();
        let mut sick = svc(2, 0.0, 100.0, "c");
        sick.healthy = 1; // one of its two local backends is down
        let mut unknown = svc(1, 0.0, 100.0, "e");
        unknown.capacity_rps = None;
        // Its one backend is ejected, and in use again: its pool is in panic.
        let mut panicking = svc(1, 0.0, 100.0, "g");
        panicking.ejected = 1;
        let s = summaries(&[
            ("d1", svc(1, 300.0, 100.0, "a")),
            ("d2", svc(1, 100.0, 100.0, "b")), // at its threshold
            ("d3", sick),
            ("d4", svc(0, 0.0, 0.0, "d")),
            ("d5", unknown),
            ("d6", svc(1, 0.0, 100.0, "f")),
            ("d7", panicking),
        ]);
        let d = p.decide(&s, Instant::now());
        let w = web(&d, "d1").expect("spills");
        assert_eq!(w.targets.keys().collect::<Vec<_>>(), vec!["d6"], "{w:?}");
        // d2 is at its threshold: it is in spill too, but gets only what d6 has left
        // (nothing worth a decision here), and never d1.
        assert!(p.is_active("d2", "web"));
        let w2 = web(&d, "d2");
        assert!(
            w2.as_ref().is_none_or(|w| !w.targets.contains_key("d1")),
            "a spilling domain is no target"
        );
        let f2 = w2.map_or(0.0, |w| w.fraction);
        assert!(
            w.fraction * 300.0 + f2 * 100.0 <= 100.5,
            "d6 overfilled: {d:?}"
        );
    }

    #[test]
    fn nothing_healthy_spills_everything_to_targets_with_room() {
        let mut p = policy();
        let s = summaries(&[
            ("d1", svc(0, 50.0, 0.0, "a")),
            ("d2", svc(1, 100.0, 100.0, "b")), // full
            ("d3", svc(1, 10.0, 100.0, "c")),
        ]);
        let w = web(&p.decide(&s, Instant::now()), "d1").expect("spills");
        assert_eq!(w.fraction, 1.0);
        assert_eq!(w.targets.keys().collect::<Vec<_>>(), vec!["d3"]);
        // Its demand outgrows its targets' room: the decision is not rewritten for that
        // alone (small weight drifts wait for the hold, as for any other).
        let mut p = policy();
        let t0 = Instant::now();
        let dead = |d3_load: f64| {
            summaries(&[
                ("d1", svc(0, 200.0, 0.0, "a")),
                ("d3", svc(1, d3_load, 100.0, "c")),
                ("d4", svc(1, 20.0, 100.0, "d")),
            ])
        };
        let first = web(&p.decide(&dead(10.0), t0), "d1").expect("spills");
        assert_eq!(first.fraction, 1.0);
        let again = web(
            &p.decide(&dead(12.0), t0 + Duration::from_millis(200)),
            "d1",
        );
        assert_eq!(again, Some(first));
        // Nowhere to go: no decision at all (not 100 % into full domains).
        let s = summaries(&[
            ("d1", svc(0, 50.0, 0.0, "a")),
            ("d2", svc(1, 100.0, 100.0, "b")),
        ]);
        let mut p = policy();
        assert!(web(&p.decide(&s, Instant::now()), "d1").is_none());
    }

    #[test]
    fn a_target_with_a_sliver_of_room_is_left_out() {
        let mut p = policy();
        let s = summaries(&[
            ("d1", svc(1, 300.0, 100.0, "a")),
            ("d2", svc(1, 0.0, 100.0, "b")),
            ("d3", svc(1, 99.9, 100.0, "c")),
        ]);
        let w = web(&p.decide(&s, Instant::now()), "d1").expect("spills");
        assert_eq!(w.targets.keys().collect::<Vec<_>>(), vec!["d2"], "{w:?}");
        assert_eq!(w.targets["d2"].weight, 1.0);
    }

    #[test]
    fn a_domain_starting_up_is_a_target_as_soon_as_its_backends_are_up() {
        let mut p = policy();
        let t0 = Instant::now();
        // d2's backend is not located yet (nothing healthy) and it has no demand.
        let s = summaries(&[
            ("d1", svc(1, 10.0, 100.0, "a")),
            ("d2", svc(0, 0.0, 0.0, "b")),
        ]);
        assert!(p.decide(&s, t0).values().all(|d| d.services.is_empty()));
        assert!(!p.is_active("d2", "web"));
        let s = pair(200.0, 0.0, 100.0);
        let w = web(&p.decide(&s, t0 + Duration::from_millis(200)), "d1").expect("spills");
        assert!(w.targets.contains_key("d2"), "{w:?}");
    }

    #[test]
    fn a_new_global_controller_keeps_the_spills_in_force() {
        let s = summaries(&[
            ("d1", svc(1, 95.0, 100.0, "a")), // in the band: would not enter by itself
            ("d2", svc(1, 0.0, 100.0, "b")),
        ]);
        let mut old = policy();
        let t0 = Instant::now();
        old.decide(&pair(150.0, 0.0, 100.0), t0);
        let in_force = old.decide(&s, t0 + Duration::from_millis(200));
        assert!(web(&in_force, "d1").is_some());
        let mut new = policy();
        for (d, dec) in &in_force {
            new.seed(d, dec, t0 + Duration::from_millis(400));
        }
        let d = new.decide(&s, t0 + Duration::from_millis(400));
        assert_eq!(web(&d, "d1"), web(&in_force, "d1"), "unchanged by failover");
        // A fresh policy would have dropped it.
        assert!(web(&policy().decide(&s, t0), "d1").is_none());
    }

    #[test]
    fn demand_counts_spilled_connections_so_a_spill_holds() {
        // The summary's load is demand (spilled included): spilling half of 200 rps
        // does not make d1 report 100 and stop. With the same demand the decision stays.
        let mut p = policy();
        let s = pair(200.0, 0.0, 200.0);
        let t0 = Instant::now();
        let first = web(&p.decide(&s, t0), "d1");
        for i in 1..50 {
            assert_eq!(
                web(&p.decide(&s, t0 + Duration::from_millis(200 * i)), "d1"),
                first
            );
        }
    }

    #[test]
    fn garbage_in_summaries_is_harmless() {
        let mut p = policy();
        let mut bad = svc(1, f64::NAN, f64::INFINITY, "a");
        bad.load_rps = f64::NAN;
        let s = summaries(&[("d1", bad), ("d2", svc(1, -5.0, -1.0, "b"))]);
        let d = p.decide(&s, Instant::now());
        assert!(d.values().all(|x| x.services.is_empty()), "{d:?}");
        assert!(DomainSummary::from_json(b"not json").is_err());
        assert!(DomainSummary::from_json(b"{}").is_ok_and(|s| s.services.is_empty()));
    }
}
