//! The gaps in the controller: one [`GapController`] per service and one for the
//! controller itself, their feedback at every tick, and their enforcement at the switches
//! (meters on the intercept and table-miss rules, OFF-period gap rules).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ofp::{Instruction, Message, MeterFlags, MeterMod, MeterModCommand};

use super::{
    ControllerGap, ControllerGapView, GapController, GapView, Gate, MeterBand, Mode,
    OverloadConfig, Refusal, SERVICE_METER_BASE, TABLE_MISS_METER, WorkSample, meter_plan,
};
use crate::config::Config;
use crate::controller::{Controller, rules};
use crate::service::ServiceState;
use crate::topology::Dpid;

/// One service's gap: its law, its gate, and whether its OFF rules are out.
#[derive(Debug, Clone)]
pub(crate) struct ServiceGap {
    pub(crate) name: String,
    pub(crate) cfg: OverloadConfig,
    pub(crate) law: GapController,
    pub(crate) gate: Gate,
    /// OFF-period rules may be installed on the switches (withdraw when the gap relaxes).
    off_rules_out: bool,
}

impl ServiceGap {
    fn new(name: &str, cfg: &OverloadConfig) -> Self {
        ServiceGap {
            name: name.to_string(),
            cfg: cfg.clone(),
            law: GapController::new(cfg.law()),
            gate: Gate::default(),
            off_rules_out: false,
        }
    }
}

/// All overload state of the controller.
#[derive(Debug, Clone)]
pub(crate) struct Overload {
    pub(crate) services: Vec<ServiceGap>,
    pub(crate) controller: ControllerGap,
    /// The meter band installed per (switch, meter id), and when it was last changed.
    installed: HashMap<(Dpid, u32), (MeterBand, Instant)>,
}

impl Overload {
    pub(crate) fn new(config: &Config) -> Self {
        Overload {
            services: config
                .services
                .iter()
                .map(|s| ServiceGap::new(&s.name, &s.overload))
                .collect(),
            controller: ControllerGap::new(config.controller.overload.clone()),
            installed: HashMap::new(),
        }
    }

    /// A new configuration: keep each surviving service's law state when its overload
    /// settings did not change.
    pub(crate) fn reload(&mut self, config: &Config) {
        let old = std::mem::take(&mut self.services);
        for s in &config.services {
            match old.iter().find(|o| o.name == s.name && o.cfg == s.overload) {
                Some(o) => self.services.push(o.clone()),
                None => self.services.push(ServiceGap::new(&s.name, &s.overload)),
            }
        }
        if self.controller.cfg != config.controller.overload {
            self.controller = ControllerGap::new(config.controller.overload.clone());
        }
    }

    fn controller_on(&self) -> bool {
        self.controller.cfg.mode != Mode::Off
    }

    /// Whether service `i`'s intercept rule carries a meter.
    fn service_metered(&self, i: usize) -> bool {
        self.controller_on()
            || self
                .services
                .get(i)
                .is_some_and(|s| s.cfg.mode != Mode::Off)
    }

    fn any_meter(&self) -> bool {
        self.controller_on() || self.services.iter().any(|s| s.cfg.mode != Mode::Off)
    }

    /// The controller's admitted PACKET_IN rate for one of `n` switches.
    fn controller_share(&self, n: usize) -> Option<f64> {
        if !self.controller_on() {
            return None;
        }
        self.controller.law.rate().map(|r| r / n.max(1) as f64)
    }

    fn wanted(&self, meter: u32, n_switches: usize) -> Option<MeterBand> {
        let share = self.controller_share(n_switches);
        if meter == TABLE_MISS_METER {
            return self
                .controller_on()
                .then(|| meter_plan(None, 1.0, share, self.controller.cfg.burst_ms));
        }
        let i = meter.checked_sub(SERVICE_METER_BASE)? as usize;
        if !self.service_metered(i) {
            return None;
        }
        let s = self.services.get(i)?;
        Some(meter_plan(
            s.law.gate_rate(),
            s.cfg.backstop_factor,
            share,
            s.cfg.burst_ms,
        ))
    }

    fn meter_ids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        if self.controller_on() {
            v.push(TABLE_MISS_METER);
        }
        for i in 0..self.services.len() {
            if self.service_metered(i) {
                v.push(SERVICE_METER_BASE + i as u32);
            }
        }
        v
    }
}

fn meter_mod(command: MeterModCommand, id: u32, band: MeterBand) -> Message {
    Message::MeterMod(MeterMod {
        command,
        // OVS 3.1's userspace datapath: PKTPS, BURST and STATS, DROP bands only (§8.1).
        flags: MeterFlags(MeterFlags::PKTPS.0 | MeterFlags::BURST.0 | MeterFlags::STATS.0),
        meter_id: id,
        bands: vec![ofp::MeterBand::Drop {
            rate: band.rate,
            burst_size: band.burst,
        }],
    })
}

/// §5.9: the meter instruction runs first, before apply-actions.
pub(crate) fn with_meter(msg: Message, meter: u32) -> Message {
    match msg {
        Message::FlowMod(mut fm) => {
            let mut ins = ofp::Instructions::new();
            ins.push(Instruction::Meter(meter));
            for i in fm.instructions.iter() {
                ins.push(i.clone());
            }
            fm.instructions = ins;
            Message::FlowMod(fm)
        }
        other => other,
    }
}

impl Controller {
    /// The meter the table-miss rule carries, if the controller gaps itself.
    pub(crate) fn overload_table_miss(&self, msg: Message) -> Message {
        if self.overload.controller_on() {
            with_meter(msg, TABLE_MISS_METER)
        } else {
            msg
        }
    }

    /// The intercept rule of `service`, with its meter when it has one.
    pub(crate) fn overload_intercept(&self, service: u16, msg: Message) -> Message {
        if self.overload.service_metered(usize::from(service)) {
            with_meter(msg, SERVICE_METER_BASE + u32::from(service))
        } else {
            msg
        }
    }

    /// On switch (re)connection, before the barrier: remove every meter (stale rates).
    pub(crate) fn overload_switch_reset(&mut self, dpid: Dpid, out: &mut Outbox) {
        self.overload.installed.retain(|(d, _), _| *d != dpid);
        if self.overload.any_meter() {
            out.push(
                dpid,
                meter_mod(
                    MeterModCommand::Delete,
                    ofp::meter::ALL,
                    MeterBand { rate: 0, burst: 0 },
                ),
            );
        }
    }

    /// Add the meters a switch lacks (before the rules that name them).
    pub(crate) fn overload_ensure_meters(&mut self, now: Instant, dpid: Dpid, out: &mut Outbox) {
        let n = self.switch_ids().count();
        for id in self.overload.meter_ids() {
            if self.overload.installed.contains_key(&(dpid, id)) {
                continue;
            }
            if let Some(band) = self.overload.wanted(id, n) {
                out.push(dpid, meter_mod(MeterModCommand::Add, id, band));
                self.overload.installed.insert((dpid, id), (band, now));
            }
        }
    }

    pub(crate) fn overload_switch_down(&mut self, dpid: Dpid) {
        self.overload.installed.retain(|(d, _), _| *d != dpid);
    }

    /// A new connection for service `si` asks the gate. Returns false when the gap refuses
    /// it; `reset` then says whether to answer with a RST.
    pub(crate) fn overload_admit(&mut self, now: Instant, si: usize, out: &mut Outbox) -> bool {
        let Some(g) = self.overload.services.get_mut(si) else {
            return true;
        };
        let gap = g.law.gate_gap();
        let ok = g.gate.admit_with_depth(now, gap, g.cfg.gate_burst);
        g.law.record(ok);
        if ok {
            if let Some(gap) = gap.filter(|gap| *gap >= g.cfg.off_rule_min_gap) {
                // An OFF period of seconds: the switch drops new connections itself until
                // the rule's hard timeout ends it (whole seconds, OpenFlow's granularity).
                let secs = gap.as_secs().clamp(1, u64::from(u16::MAX)) as u16;
                g.off_rules_out = true;
                let msgs = self.gap_rules(si, Some(secs));
                let dpids: Vec<Dpid> = self.switch_ids().collect();
                for d in dpids {
                    for m in &msgs {
                        out.push(d, m.clone());
                    }
                }
            }
        }
        ok
    }

    /// Whether a gapped connection of `si` is refused with a RST (else dropped).
    pub(crate) fn overload_refusal_resets(&self, si: usize) -> bool {
        self.overload
            .services
            .get(si)
            .is_none_or(|g| g.cfg.refusal == Refusal::Reset)
    }

    /// Gap rules for service `si`: add (with `hard_timeout`) or delete (`None`).
    fn gap_rules(&self, si: usize, hard_timeout: Option<u16>) -> Vec<Message> {
        let mut v = Vec::new();
        for (&(addr, port), l) in &self.listeners {
            if usize::from(l.service) != si {
                continue;
            }
            v.push(match hard_timeout {
                Some(t) => rules::gap_drop(l.service, addr, port, t),
                None => rules::gap_delete(l.service),
            });
            if hard_timeout.is_none() {
                break;
            }
        }
        v
    }

    /// The runtime's measurement of the controller's own PACKET_IN work.
    pub fn record_packet_in_work(&mut self, sample: WorkSample) {
        self.overload.controller.record(sample);
    }

    /// Feedback and control: measure every destination's load, adapt its gap, and bring
    /// the switches' meters and gap rules in line. Called from [`Controller::handle_tick`].
    pub(crate) fn overload_tick(&mut self, now: Instant, out: &mut Outbox) {
        if let Some(step) = self.overload.controller.step(now) {
            if step.before.is_some() != step.after.is_some() {
                let detail = format!("controller: admitted PACKET_IN rate {:?}", step.after);
                self.event(now, "overload", detail);
            }
        }
        let mut events = Vec::new();
        let mut withdraw = Vec::new();
        for (i, g) in self.overload.services.iter_mut().enumerate() {
            if g.cfg.mode == Mode::Off || !g.law.due(now) {
                continue;
            }
            g.law.measure(now);
            let Some(s) = self.services.get(i) else {
                continue;
            };
            let load = service_load(s, &g.cfg, g.law.admitted_rate());
            let step = g.law.control(now, load);
            if step.before.is_some() != step.after.is_some() {
                events.push(format!(
                    "{}: {} (load {:.2})",
                    g.name,
                    match step.after {
                        Some(a) => format!("gapping, admitted rate {a:.1}/s"),
                        None => "gap lifted".to_string(),
                    },
                    load
                ));
            }
            if g.off_rules_out && g.law.gap().is_none_or(|gap| gap < g.cfg.off_rule_min_gap) {
                g.off_rules_out = false;
                withdraw.push(i);
            }
        }
        for e in events {
            self.event(now, "overload", e);
        }
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for i in withdraw {
            let msgs = self.gap_rules(i, None);
            for &d in &dpids {
                for m in &msgs {
                    out.push(d, m.clone());
                }
            }
        }
        // Meters: only when the quantized rate changed, and not more often than the hold
        // time (each OFPMC_MODIFY refills the bucket).
        let n = dpids.len();
        for id in self.overload.meter_ids() {
            let Some(want) = self.overload.wanted(id, n) else {
                continue;
            };
            let hold = match id.checked_sub(SERVICE_METER_BASE) {
                Some(i) => self
                    .overload
                    .services
                    .get(i as usize)
                    .map_or(Duration::ZERO, |s| s.cfg.meter_hold),
                None => self.overload.controller.cfg.interval,
            };
            for &d in &dpids {
                let Some(&(have, at)) = self.overload.installed.get(&(d, id)) else {
                    continue;
                };
                if have != want && now.saturating_duration_since(at) >= hold {
                    out.push(d, meter_mod(MeterModCommand::Modify, id, want));
                    self.overload.installed.insert((d, id), (want, now));
                }
            }
        }
    }

    /// Gap state of service `i` (mode, admitted rate or gap, refused count), for the API.
    pub fn gap_view(&self, service: usize) -> Option<GapView> {
        self.overload.services.get(service).map(|g| g.law.view())
    }

    /// The controller's own overload state, for the API.
    pub fn controller_gap_view(&self) -> ControllerGapView {
        self.overload.controller.view()
    }

    /// The meter band installed on `dpid` for `meter`, as the controller last set it.
    pub fn installed_meter(&self, dpid: Dpid, meter: u32) -> Option<MeterBand> {
        self.overload.installed.get(&(dpid, meter)).map(|(b, _)| *b)
    }
}

use crate::controller::Outbox;

/// A service's load ρ: the largest of its configured ratios (1.0 = at target).
pub(crate) fn service_load(s: &ServiceState, cfg: &OverloadConfig, admitted_rate: f64) -> f64 {
    let mut load: f64 = 0.0;
    if let Some(cap) = cfg.capacity_rps {
        load = load.max(admitted_rate / cap);
    }
    if let Some(max) = cfg.max_active_connections {
        let active: f64 = s
            .backends
            .iter()
            .map(|b| b.reported_active.unwrap_or(f64::from(b.active_connections)))
            .sum();
        load = load.max(active / f64::from(max));
    }
    if let Some(target) = cfg.target_response_ms {
        let (sum, n) = s
            .backends
            .iter()
            .filter_map(|b| b.response_time_ms)
            .fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
        if n > 0 {
            load = load.max(sum / f64::from(n) / target);
        }
    }
    load
}
