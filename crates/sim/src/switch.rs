//! What the simulation keeps of each switch, from the controller's messages: its meters
//! (token buckets, drop band only, as Open vSwitch's), the gap rules of the services'
//! OFF periods, which meter the intercept rule of new connections carries, and how many
//! connection rules it holds.
//!
//! The data path is not simulated packet by packet: a connection's rules carry it
//! without the controller, so only the first SYN of each connection (and its
//! retransmissions) is looked up here, against what decides its fate before the
//! controller: a gap rule (priority 250, dropped) or the intercept rule's meter.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ahash::RandomState;
use flowgate_core::cookie::{self, RuleKind};
use ofp::{FlowMod, FlowModCommand, Instruction, MeterBand, MeterMod, MeterModCommand, Oxm};

/// The priority of the OFF-period rules (`controller::rules`): drop new connections.
const PRIO_GAP: u16 = 250;

/// An OpenFlow meter with one drop band: a token bucket of `burst` packets filled at
/// `rate` a second (§5.7; Open vSwitch's meters count packets with `OFPMF_PKTPS`).
#[derive(Debug, Clone)]
pub struct Meter {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: u64,
    pub packets: u64,
    pub dropped: u64,
}

impl Meter {
    fn new(rate: u32, burst: u32, now: u64) -> Self {
        let burst = f64::from(burst.max(1));
        Meter {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            at: now,
            packets: 0,
            dropped: 0,
        }
    }

    /// A packet at `now`: whether the band lets it through.
    pub fn pass(&mut self, now: u64) -> bool {
        let dt = now.saturating_sub(self.at) as f64 / 1e9;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now;
        self.packets += 1;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

#[derive(Debug, Default)]
pub struct Switch {
    pub meters: HashMap<u32, Meter, RandomState>,
    /// Service address → its gap rule's cookie, and when the rule ends (ns).
    gaps: HashMap<Ipv4Addr, (u64, u64), RandomState>,
    /// Service address → the meter its intercept rule names.
    intercept_meter: HashMap<Ipv4Addr, u32, RandomState>,
    pub conn_rules: usize,
    pub max_conn_rules: usize,
}

fn ipv4_dst(fm: &FlowMod) -> Option<Ipv4Addr> {
    fm.match_.iter().find_map(|o| match o {
        Oxm::Ipv4Dst { value, mask: None } => Some(*value),
        _ => None,
    })
}

fn meter_of(fm: &FlowMod) -> Option<u32> {
    fm.instructions.iter().find_map(|i| match i {
        Instruction::Meter(m) => Some(*m),
        _ => None,
    })
}

impl Switch {
    /// A FLOW_MOD from the controller, as far as the switch's own state needs it (its
    /// connection rules are counted by the engine, which knows their connections).
    pub fn flow_mod(&mut self, now: u64, fm: &FlowMod) {
        let add = matches!(
            fm.command,
            FlowModCommand::Add | FlowModCommand::Modify | FlowModCommand::ModifyStrict
        );
        match cookie::kind_of(fm.cookie) {
            Some(RuleKind::Gap) if fm.priority == PRIO_GAP => {
                let Some(addr) = ipv4_dst(fm) else { return };
                if add {
                    // A rule without a hard timeout holds until deleted.
                    let until = match fm.hard_timeout {
                        0 => u64::MAX,
                        s => now + u64::from(s) * 1_000_000_000,
                    };
                    self.gaps.insert(addr, (fm.cookie, until));
                } else {
                    self.gaps.remove(&addr);
                }
            }
            Some(RuleKind::Gap) if !add => {
                // A service's OFF-period rules withdrawn by their cookie (§7.3.4.1).
                let (cookie, mask) = (fm.cookie, fm.cookie_mask);
                self.gaps.retain(|_, (c, _)| *c & mask != cookie & mask);
            }
            Some(RuleKind::Intercept) if add => {
                if let (Some(addr), Some(m)) = (ipv4_dst(fm), meter_of(fm)) {
                    self.intercept_meter.insert(addr, m);
                } else if let Some(addr) = ipv4_dst(fm) {
                    self.intercept_meter.remove(&addr);
                }
            }
            _ => {}
        }
    }

    /// A connection rule was added (not one that replaced its like, §6.4).
    pub fn conn_rule_added(&mut self) {
        self.conn_rules += 1;
        self.max_conn_rules = self.max_conn_rules.max(self.conn_rules);
    }

    /// A connection rule expired (its FLOW_REMOVED is sent, or it was not asked for).
    pub fn conn_rule_gone(&mut self) {
        self.conn_rules = self.conn_rules.saturating_sub(1);
    }

    pub fn meter_mod(&mut self, now: u64, mm: &MeterMod) {
        match mm.command {
            MeterModCommand::Delete => {
                self.meters.remove(&mm.meter_id);
            }
            _ => {
                let band = mm.bands.iter().find_map(|b| match b {
                    MeterBand::Drop { rate, burst_size } => Some((*rate, *burst_size)),
                    _ => None,
                });
                match band {
                    Some((rate, burst)) => {
                        // §7.3.4.4: a MODIFY replaces the bands; the bucket starts full,
                        // and its counts start from zero, as Open vSwitch's userspace
                        // meters do (the controller's METER_STATS accounting relies on it,
                        // `Controller::overload_meter_stats`).
                        self.meters
                            .insert(mm.meter_id, Meter::new(rate, burst, now));
                    }
                    None => {
                        self.meters.remove(&mm.meter_id);
                    }
                }
            }
        }
    }

    /// A new connection's SYN to `service` enters this switch at `now`: whether it goes
    /// up to the controller, or is dropped by a gap rule (an OFF period) or by the
    /// intercept rule's meter.
    pub fn admits_syn(&mut self, now: u64, service: Ipv4Addr) -> bool {
        if let Some(&(_, until)) = self.gaps.get(&service) {
            if now < until {
                return false;
            }
            self.gaps.remove(&service);
        }
        match self
            .intercept_meter
            .get(&service)
            .and_then(|id| self.meters.get_mut(id))
        {
            Some(m) => m.pass(now),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_lets_its_rate_through_after_its_burst() {
        let mut m = Meter::new(1000, 10, 0);
        let passed = (0..100).filter(|_| m.pass(0)).count();
        assert_eq!(passed, 10, "the burst, at one instant");
        // Over the next second, 1 a ms: each gets a token.
        let passed = (1..=1000).filter(|ms| m.pass(ms * 1_000_000)).count();
        assert_eq!(passed, 1000);
        assert_eq!(m.dropped, 90);
    }

    #[test]
    fn a_modified_meter_counts_from_zero_as_open_vswitch_does() {
        let mm = |command, rate| MeterMod {
            command,
            flags: ofp::MeterFlags(0),
            meter_id: 16,
            bands: vec![MeterBand::Drop {
                rate,
                burst_size: 1,
            }],
        };
        let mut sw = Switch::default();
        sw.meter_mod(0, &mm(MeterModCommand::Add, 1));
        let m = sw.meters.get_mut(&16).expect("added");
        let passed = (0..10).filter(|_| m.pass(0)).count();
        assert_eq!((passed, m.dropped), (1, 9));
        sw.meter_mod(0, &mm(MeterModCommand::Modify, 2));
        let m = &sw.meters[&16];
        assert_eq!((m.packets, m.dropped), (0, 0), "the counts restart");
    }
}
