//! The gaps in the controller: one [`GapController`] per service and one for the
//! controller itself, their feedback at every tick, and their enforcement at the switches
//! (meters on the intercept and table-miss rules and the OFPM_CONTROLLER meter, OFF-period
//! gap rules). Each law's admitted rate is split across the switches by their measured
//! demand (PACKET_INs seen plus what their meters dropped, from METER_STATS).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use ofp::{Instruction, Message, MeterFlags, MeterMod, MeterModCommand};

use super::{Controller, Outbox, rules};
use crate::config::Config;
use crate::overload::{
    ControllerGap, ControllerGapView, GapController, GapView, Gate, MeterBand, Mode,
    OverloadConfig, Refusal, SERVICE_METER_BASE, SwitchDemand, SwitchShareView, TABLE_MISS_METER,
    WorkSample, apply_split, max_min_fair, meter_change_due, meter_plan,
};
use crate::service::ServiceState;
use crate::topology::Dpid;

/// One service's gap: its law, its gate, and whether its OFF rules are out.
#[derive(Debug, Clone)]
pub(crate) struct ServiceGap {
    pub(crate) name: String,
    /// The service's slot (`ServiceState::slot`): its meter is `SERVICE_METER_BASE + slot`.
    slot: u16,
    pub(crate) cfg: OverloadConfig,
    pub(crate) law: GapController,
    pub(crate) gate: Gate,
    /// OFF-period rules may be installed on the switches (withdraw when the gap relaxes).
    off_rules_out: bool,
    /// Per switch: offered demand, share of the admitted rate, and its own gate.
    pub(crate) per_switch: BTreeMap<Dpid, SwitchDemand>,
    /// The service's new-flow demand on the controller, the max-min fair level of the
    /// controller's admitted rate (see `overload_tick`), and the gate that enforces it.
    ctl: SwitchDemand,
    /// New flows the controller's gate dropped (`ctl`).
    ctl_refused_total: u64,
}

impl ServiceGap {
    fn new(name: &str, cfg: &OverloadConfig, slot: u16) -> Self {
        ServiceGap {
            name: name.to_string(),
            slot,
            ctl: SwitchDemand::default(),
            ctl_refused_total: 0,
            cfg: cfg.clone(),
            law: GapController::new(cfg.law()),
            gate: Gate::default(),
            off_rules_out: false,
            per_switch: BTreeMap::new(),
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
    /// Switches whose meters were all deleted when they connected: every meter they hold
    /// is in `installed`. Another may hold meters from an earlier run (or from before a
    /// reload turned gapping off and on again), and an OFPMC_ADD of one of those would
    /// be refused (OFPMMFC_METER_EXISTS), leaving the old band in force.
    cleared: HashSet<Dpid>,
    /// The last refusal was the controller's gate (silent), not the service's.
    last_refusal_by_controller: bool,
    /// New flows the controller's own gate dropped, ever: the runtime reads it around
    /// each PACKET_IN to tell the work it shed from the work it did.
    shed_total: u64,
    /// Per switch: its PACKET_IN demand on the controller and its share of the
    /// controller's admitted rate.
    ctl_switches: BTreeMap<Dpid, CtlSwitch>,
    /// When the controller's per-switch demand was last measured.
    ctl_last: Option<Instant>,
    /// Last band packet count seen per (switch, meter id) in METER_STATS.
    meter_seen: HashMap<(Dpid, u32), u64>,
    /// Per switch: METER_STATS requests sent and replies seen. Replies come in request
    /// order (one TCP connection), so a reply numbered above the poll count at the time
    /// of an OFPMC_MODIFY shows the modified meter, whose counts OVS restarted.
    polls: HashMap<Dpid, (u64, u64)>,
    /// Per (switch, meter id): the poll count when the meter was last modified.
    modified_at_poll: HashMap<(Dpid, u32), u64>,
    /// Band drops per (switch, meter id) since the switch connected.
    meter_dropped: HashMap<(Dpid, u32), u64>,
    last_meter_poll: Option<Instant>,
}

/// One switch's PACKET_IN demand on the controller.
#[derive(Debug, Clone, Copy, Default)]
struct CtlSwitch {
    demand: SwitchDemand,
    /// The switch's PACKET_IN counter at the last measurement.
    packet_in_seen: u64,
}

impl Overload {
    pub(crate) fn new(config: &Config) -> Self {
        Overload {
            services: config
                .services
                .iter()
                .zip(0u16..)
                .map(|(s, slot)| ServiceGap::new(&s.name, &s.overload, slot))
                .collect(),
            controller: ControllerGap::new(config.controller.overload.clone()),
            installed: HashMap::new(),
            cleared: HashSet::new(),
            ctl_switches: BTreeMap::new(),
            last_refusal_by_controller: false,
            shed_total: 0,
            ctl_last: None,
            meter_seen: HashMap::new(),
            polls: HashMap::new(),
            modified_at_poll: HashMap::new(),
            meter_dropped: HashMap::new(),
            last_meter_poll: None,
        }
    }

    /// A new configuration (`slots`: each service's, in its order): each surviving service
    /// keeps its demand on the controller, and its law state when its overload settings
    /// did not change.
    pub(crate) fn reload(&mut self, config: &Config, slots: &[u16]) {
        let old = std::mem::take(&mut self.services);
        for (s, &slot) in config.services.iter().zip(slots) {
            let prev = old.iter().find(|o| o.name == s.name);
            let mut g = match prev.filter(|o| o.cfg == s.overload) {
                Some(o) => o.clone(),
                None => ServiceGap::new(&s.name, &s.overload, slot),
            };
            if let Some(o) = prev {
                g.ctl = o.ctl;
            }
            g.slot = slot;
            self.services.push(g);
        }
        if self.controller.cfg != config.controller.overload {
            self.controller = ControllerGap::new(config.controller.overload.clone());
        }
    }

    /// A switch left (or reconnected): its meters, counts and shares start over.
    fn forget_switch(&mut self, dpid: Dpid) {
        self.installed.retain(|(d, _), _| *d != dpid);
        self.cleared.remove(&dpid);
        self.meter_seen.retain(|(d, _), _| *d != dpid);
        self.modified_at_poll.retain(|(d, _), _| *d != dpid);
        self.polls.remove(&dpid);
        self.meter_dropped.retain(|(d, _), _| *d != dpid);
        self.ctl_switches.remove(&dpid);
        for s in &mut self.services {
            s.per_switch.remove(&dpid);
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

    /// Switch `dpid`'s share of the controller's admitted PACKET_IN rate (split by
    /// demand; an even split for a switch not measured yet).
    fn controller_share(&self, dpid: Dpid, n: usize) -> Option<f64> {
        if !self.controller_on() {
            return None;
        }
        let rate = self.controller.law.rate()?;
        Some(
            self.ctl_switches
                .get(&dpid)
                .and_then(|s| s.demand.share)
                .unwrap_or(rate / n.max(1) as f64),
        )
    }

    /// Service `i`'s admitted rate on switch `dpid`: its demand share of the law's.
    fn service_share(&self, i: usize, dpid: Dpid, n: usize) -> Option<f64> {
        let s = self.services.get(i)?;
        let rate = s.law.gate_rate()?;
        Some(
            s.per_switch
                .get(&dpid)
                .and_then(|d| d.share)
                .unwrap_or(rate / n.max(1) as f64),
        )
    }

    /// Service `i`'s meter id.
    fn meter_of(&self, i: usize) -> Option<u32> {
        let g = self.services.get(i)?;
        Some(SERVICE_METER_BASE + u32::from(g.slot))
    }

    /// The service whose meter `meter` is.
    fn service_of(&self, meter: u32) -> Option<usize> {
        let slot = meter.checked_sub(SERVICE_METER_BASE)?;
        self.services.iter().position(|g| u32::from(g.slot) == slot)
    }

    fn wanted(&self, meter: u32, dpid: Dpid, n_switches: usize) -> Option<MeterBand> {
        let share = self.controller_share(dpid, n_switches);
        if meter == TABLE_MISS_METER {
            return self
                .controller_on()
                .then(|| meter_plan(None, 1.0, share, self.controller.cfg.burst_ms));
        }
        let i = self.service_of(meter)?;
        if !self.service_metered(i) {
            return None;
        }
        let s = self.services.get(i)?;
        Some(meter_plan(
            self.service_share(i, dpid, n_switches),
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
                v.extend(self.meter_of(i));
            }
        }
        v
    }

    /// Forget meter `id` on every switch; returns the switches that had it.
    fn forget_meter(&mut self, id: u32) -> Vec<Dpid> {
        let had: Vec<Dpid> = self
            .installed
            .keys()
            .filter(|(_, m)| *m == id)
            .map(|(d, _)| *d)
            .collect();
        self.installed.retain(|(_, m), _| *m != id);
        self.meter_seen.retain(|(_, m), _| *m != id);
        self.modified_at_poll.retain(|(_, m), _| *m != id);
        self.meter_dropped.retain(|(_, m), _| *m != id);
        had
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
        let i = usize::from(service);
        match self.overload.meter_of(i) {
            Some(id) if self.overload.service_metered(i) => with_meter(msg, id),
            _ => msg,
        }
    }

    /// After a reload (its intercept rules replaced): the meters and gap rules of the
    /// services that went, by their `slots`, leave the switches. A meter no rule names
    /// any longer would sit on the switch, and the slot's next service would find its
    /// band there.
    pub(crate) fn overload_release(&mut self, slots: &[u16], out: &mut Outbox) {
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for &slot in slots {
            let id = SERVICE_METER_BASE + u32::from(slot);
            for d in self.overload.forget_meter(id) {
                // OFPMC_DELETE removes the flows that use the meter (OVS does, as
                // OpenFlow asks): after the barrier, none is left to.
                out.push(d, Message::BarrierRequest);
                out.push(
                    d,
                    meter_mod(MeterModCommand::Delete, id, MeterBand { rate: 0, burst: 0 }),
                );
            }
            for &d in &dpids {
                out.push(d, rules::gap_delete_slot(slot));
            }
        }
    }

    /// On switch (re)connection, before the barrier: remove every meter (stale rates).
    /// Not when no meter is in use: a switch without meters need not hear of them.
    pub(crate) fn overload_switch_reset(&mut self, dpid: Dpid, out: &mut Outbox) {
        self.overload.forget_switch(dpid);
        if self.overload.any_meter() {
            out.push(
                dpid,
                meter_mod(
                    MeterModCommand::Delete,
                    ofp::meter::ALL,
                    MeterBand { rate: 0, burst: 0 },
                ),
            );
            self.overload.cleared.insert(dpid);
        }
    }

    /// Add the meters a switch lacks (before the rules that name them). On a switch that
    /// was not cleared when it connected, each goes first (a delete of a meter that does
    /// not exist is no error; no rule names it yet).
    pub(crate) fn overload_ensure_meters(&mut self, now: Instant, dpid: Dpid, out: &mut Outbox) {
        let n = self.switch_ids().count();
        for id in self.overload.meter_ids() {
            if self.overload.installed.contains_key(&(dpid, id)) {
                continue;
            }
            if let Some(band) = self.overload.wanted(id, dpid, n) {
                if !self.overload.cleared.contains(&dpid) {
                    out.push(dpid, meter_mod(MeterModCommand::Delete, id, band));
                }
                out.push(dpid, meter_mod(MeterModCommand::Add, id, band));
                self.overload.installed.insert((dpid, id), (band, now));
            }
        }
    }

    /// Whether the controller is gapping service `si`'s new flows (it asks more of the
    /// controller's admitted rate than the fair level).
    pub(crate) fn overload_controller_gapping(&self, si: usize) -> bool {
        let constrained = |c: &SwitchDemand| c.share.is_some_and(|share| share < ctl_demand(c));
        let services = &self.overload.services;
        let Some(c) = services
            .get(si)
            .map(|g| &g.ctl)
            .filter(|c| c.share.is_some())
        else {
            return false;
        };
        // A quiet service beside a flood is not gapped: when another service is held below
        // what it asks (the flood) and this one gets all it asks (an unconstrained share is
        // the demand), its SYNs all pass the gate, and deferring its rules would only make
        // each of its connections cross the flooded channel to the controller three times
        // (SYN, SYN-ACK, ACK) instead of once: in `ovs_overload_packet_in_flood` 9 of 41
        // such deferred handshakes were abandoned, 10 of 45 connections failed. With no
        // flood to tell apart (no service constrained), every service defers.
        constrained(c) || !services.iter().any(|g| constrained(&g.ctl))
    }

    /// Whether service `si`'s OFF-period rules may be on the switches.
    pub(crate) fn overload_off_rules_out(&self, si: usize) -> bool {
        self.overload
            .services
            .get(si)
            .is_some_and(|g| g.off_rules_out)
    }

    pub(crate) fn overload_switch_down(&mut self, dpid: Dpid) {
        self.overload.forget_switch(dpid);
    }

    /// A new connection for service `si`, brought in by switch `dpid`, asks that switch's
    /// gate (its share of the service's admitted rate). Returns false when the gap refuses
    /// it. No allocation on this path: the per-switch entry exists once the switch was
    /// measured (a control interval after it connected); until then the service's gate
    /// decides.
    pub(crate) fn overload_admit(
        &mut self,
        now: Instant,
        dpid: Dpid,
        si: usize,
        out: &mut Outbox,
    ) -> bool {
        self.overload.last_refusal_by_controller = false;
        // The controller's own gate first: while the controller gaps itself, each service
        // is held to the max-min fair level of the controller's admitted rate, and a new
        // flow beyond it is dropped without a word (no FLOW_MOD, no PACKET_OUT: the
        // controller and its channel to the switch are what is overloaded).
        let interval = self.overload.controller.cfg.interval;
        if let Some(g) = self.overload.services.get_mut(si) {
            let c = &mut g.ctl;
            c.arrival();
            if let Some(level) = c.share {
                let gap = Duration::from_secs_f64(1.0 / level.max(1e-3));
                // A control interval's worth of tokens: the level holds over an interval,
                // not between two SYNs. A flooded service empties any bucket, so its depth
                // only matters to a quiet one, whose SYNs may arrive together: held up on
                // their way, or in one batch of PACKET_INs, which the runtime hands the
                // core at one timestamp (a bucket of two tokens admitted ~2 per batch,
                // 7–10k/s of a 40–100k/s rate, measured). The whole rate used to slow OVS
                // under a flood, each admitted SYN leaving two rules in its flow table (the
                // PACKET_IN rate OVS delivered sank to a quarter in
                // `ovs_overload_packet_in_flood`); while the controller gaps, a connection's
                // rules now wait for its client's ACK (`controller::handshake`), so a
                // flood's SYNs leave none.
                let window = interval.max(GATE_BATCH_WINDOW).as_secs_f64();
                let depth = crate::overload::config::DEFAULT_GATE_BURST.max(level * window);
                if !c.gate.admit_with_depth(now, Some(gap), depth) {
                    g.ctl_refused_total += 1;
                    self.overload.last_refusal_by_controller = true;
                    self.overload.shed_total += 1;
                    self.overload.controller.law.refused_total += 1;
                    return false;
                }
            }
        }
        let Some(g) = self.overload.services.get_mut(si) else {
            return true;
        };
        let gap = g.law.gate_gap();
        let ok = match g.per_switch.get_mut(&dpid) {
            Some(d) => {
                d.arrival();
                let share_gap = match (gap, d.share) {
                    (Some(_), Some(share)) => Some(Duration::from_secs_f64(1.0 / share.max(1e-3))),
                    (gap, _) => gap,
                };
                d.gate
                    .admit_with_depth(now, share_gap, batch_depth(g.cfg.gate_burst, share_gap))
            }
            None => g
                .gate
                .admit_with_depth(now, gap, batch_depth(g.cfg.gate_burst, gap)),
        };
        g.law.record(ok);
        if ok && let Some(gap) = gap.filter(|gap| *gap >= g.cfg.off_rule_min_gap) {
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
        ok
    }

    /// Whether a gapped connection of `si` is refused with a RST (else dropped). The
    /// controller's own gate never answers.
    pub(crate) fn overload_refusal_resets(&self, si: usize) -> bool {
        !self.overload.last_refusal_by_controller
            && self
                .overload
                .services
                .get(si)
                .is_none_or(|g| g.cfg.refusal == Refusal::Reset)
    }

    /// Gap rules for service `si`: add (with `hard_timeout`) or delete (`None`).
    fn gap_rules(&self, si: usize, hard_timeout: Option<u16>) -> Vec<Message> {
        let mut v = Vec::new();
        let Some(slot) = self.services.get(si).map(|s| s.slot) else {
            return v;
        };
        for (&(addr, port), l) in &self.listeners {
            if usize::from(l.service) != si {
                continue;
            }
            v.push(match hard_timeout {
                Some(t) => rules::gap_drop(slot, addr, port, t),
                None => rules::gap_delete(slot),
            });
            if hard_timeout.is_none() {
                break;
            }
        }
        v
    }

    /// New flows the controller's own gate has dropped so far (see [`WorkSample::shed`]).
    pub fn shed_total(&self) -> u64 {
        self.overload.shed_total
    }

    /// The runtime's measurement of the controller's own PACKET_IN work.
    pub fn record_packet_in_work(&mut self, sample: WorkSample) {
        self.overload.controller.record(sample);
    }

    /// Feedback and control: measure every destination's load, adapt its gap, and bring
    /// the switches' meters and gap rules in line. Called from [`Controller::handle_tick`].
    pub(crate) fn overload_tick(&mut self, now: Instant, out: &mut Outbox) {
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        if let Some(step) = self.overload.controller.step(now) {
            if step.before.is_some() != step.after.is_some() {
                let detail = format!("controller: admitted PACKET_IN rate {:?}", step.after);
                self.event(now, "overload", detail);
            }
            // Each switch's PACKET_IN demand: what it delivered plus what its meters
            // dropped (counted when METER_STATS came back); the controller's admitted rate
            // is split by it.
            let dt = self
                .overload
                .ctl_last
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            self.overload.ctl_last = Some(now);
            for &d in &dpids {
                let pin = self.switch_view(d).map_or(0, |v| v.packet_in);
                let s = self.overload.ctl_switches.entry(d).or_insert(CtlSwitch {
                    demand: SwitchDemand::default(),
                    packet_in_seen: pin,
                });
                s.demand.arrivals(pin.saturating_sub(s.packet_in_seen));
                s.packet_in_seen = pin;
                s.demand.measure(dt);
            }
            let rate = self
                .overload
                .controller_on()
                .then(|| self.overload.controller.law.rate())
                .flatten();
            apply_split(
                rate,
                self.overload
                    .ctl_switches
                    .values_mut()
                    .map(|s| &mut s.demand),
            );
            // The controller's admitted rate among the services, max-min fair by their
            // new-flow demand, enforced by a gate per service at the fair level: the share
            // of the services held below what they ask. A service that asks less is not
            // held to what it asked: gated at its own share (its measured demand), a
            // quiet service's SYNs that came in together (held up on their way, as by a
            // switch short of CPU) emptied its bucket of two, the rest were dropped, and
            // their clients waited out a SYN retransmission (1 s): seen on OVS in
            // `ovs_overload_packet_in_flood`, 2 of 45 connections, with the host's two
            // cores busy elsewhere. The level still bounds a service whose demand jumps
            // until the next interval measures it.
            for g in &mut self.overload.services {
                g.ctl.measure(dt);
            }
            match rate {
                None => self
                    .overload
                    .services
                    .iter_mut()
                    .for_each(|g| g.ctl.share = None),
                Some(r) => {
                    let d: Vec<f64> = self
                        .overload
                        .services
                        .iter()
                        .map(|g| ctl_demand(&g.ctl))
                        .collect();
                    let level = max_min_fair(r, &d).into_iter().fold(0.0, f64::max);
                    for g in &mut self.overload.services {
                        g.ctl.share = Some(level);
                    }
                }
            }
        }
        // METER_STATS (§7.3.5.12) from every switch, every controller interval: the band
        // counts say how many packets the meters dropped, i.e. what the switches were
        // offered beyond what reached the controller.
        let poll = self.overload.controller.cfg.interval;
        if self.overload.any_meter()
            && self
                .overload
                .last_meter_poll
                .is_none_or(|t| now.saturating_duration_since(t) >= poll)
        {
            self.overload.last_meter_poll = Some(now);
            for &d in &dpids {
                self.overload.polls.entry(d).or_default().0 += 1;
                out.push(
                    d,
                    Message::MultipartRequest(ofp::MultipartRequest::new(
                        ofp::MultipartRequestBody::Meter {
                            meter_id: ofp::meter::ALL,
                        },
                    )),
                );
            }
        }
        let mut events = Vec::new();
        let mut withdraw = Vec::new();
        for (i, g) in self.overload.services.iter_mut().enumerate() {
            if g.cfg.mode == Mode::Off || !g.law.due(now) {
                continue;
            }
            let dt = g.law.measure(now);
            let Some(s) = self.services.get(i) else {
                continue;
            };
            let load = service_load(s, &g.cfg, g.law.admitted_rate());
            let step = g.law.control(now, load);
            // Split the service's admitted rate across the switches that bring its new
            // flows, by their offered demand.
            for &d in &dpids {
                g.per_switch.entry(d).or_default();
            }
            for d in g.per_switch.values_mut() {
                d.measure(dt);
            }
            apply_split(g.law.gate_rate(), g.per_switch.values_mut());
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
        for i in withdraw {
            let msgs = self.gap_rules(i, None);
            for &d in &dpids {
                for m in &msgs {
                    out.push(d, m.clone());
                }
            }
        }
        // Meters: only when the quantized rate changed enough, and not more often than the
        // hold time (each OFPMC_MODIFY refills the bucket: `meter_change_due`).
        let n = dpids.len();
        for id in self.overload.meter_ids() {
            let hold = match self.overload.service_of(id) {
                Some(i) => self.overload.services[i].cfg.meter_hold,
                None => self.overload.controller.cfg.interval,
            };
            for &d in &dpids {
                let Some(want) = self.overload.wanted(id, d, n) else {
                    continue;
                };
                let Some(&(have, at)) = self.overload.installed.get(&(d, id)) else {
                    continue;
                };
                if meter_change_due(have, want, now.saturating_duration_since(at), hold) {
                    out.push(d, meter_mod(MeterModCommand::Modify, id, want));
                    self.overload.installed.insert((d, id), (want, now));
                    let polls = self.overload.polls.get(&d).map_or(0, |p| p.0);
                    self.overload.modified_at_poll.insert((d, id), polls);
                }
            }
        }
    }

    /// Gap state of service `i` (mode, admitted rate or gap, refused count, per-switch
    /// shares and meter drops), for the API.
    pub fn gap_view(&self, service: usize) -> Option<GapView> {
        let g = self.overload.services.get(service)?;
        let mut v = g.law.view();
        let id = self.overload.meter_of(service)?;
        v.switches = g
            .per_switch
            .iter()
            .map(|(&d, s)| self.share_view(d, Some(id), &s.demand_view()))
            .collect();
        v.handshakes = self.services.get(service).map(|s| s.handshakes);
        v.controller_refused_total = Some(g.ctl_refused_total);
        Some(v)
    }

    /// The controller's own overload state, for the API.
    pub fn controller_gap_view(&self) -> ControllerGapView {
        let mut v = self.overload.controller.view();
        v.gap.switches = self
            .overload
            .ctl_switches
            .iter()
            .map(|(&d, s)| self.share_view(d, None, &s.demand.demand_view()))
            .collect();
        v
    }

    /// One switch's part of a gap; `meter`: the service's meter, or `None` for the
    /// controller's (the table-miss meter's rate, and the drops of all its meters).
    fn share_view(
        &self,
        dpid: Dpid,
        meter: Option<u32>,
        d: &(f64, Option<f64>),
    ) -> SwitchShareView {
        let o = &self.overload;
        let dropped = match meter {
            Some(m) => o.meter_dropped.get(&(dpid, m)).copied().unwrap_or(0),
            None => o
                .meter_dropped
                .iter()
                .filter(|((sw, _), _)| *sw == dpid)
                .map(|(_, n)| *n)
                .sum(),
        };
        let id = meter.unwrap_or(TABLE_MISS_METER);
        SwitchShareView {
            dpid: format!("{dpid:016x}"),
            offered_rate: d.0,
            admitted_rate_limit: d.1,
            meter_rate: o.installed.get(&(dpid, id)).map(|(b, _)| b.rate),
            meter_dropped_total: dropped,
        }
    }

    /// A METER_STATS reply (§7.3.5.12): the drops since the last reply, per meter, are
    /// offered demand the gate never saw. OVS's userspace datapath restarts a meter's
    /// counts on OFPMC_MODIFY (measured: `ovs-ofctl meter-stats` shows the band count
    /// since the last modification), so the first reply to a request sent after a
    /// modification counts from zero; a count below the last one is a restart too.
    ///
    /// A reply may come in parts (`more`: OFPMPF_REPLY_MORE, §7.3.5); every part answers
    /// the same request, so they share its reply index, counted when the last part ends it.
    pub(crate) fn overload_meter_stats(
        &mut self,
        dpid: Dpid,
        stats: &[ofp::MeterStats],
        more: bool,
    ) {
        let reply = {
            let p = self.overload.polls.entry(dpid).or_default();
            let index = p.1 + 1;
            if !more {
                p.1 = index;
            }
            index
        };
        for st in stats {
            // The switch's counters: summed without overflow, whatever it sends.
            let count = st
                .band_stats
                .iter()
                .fold(0u64, |a, b| a.saturating_add(b.packet_band_count));
            let key = (dpid, st.meter_id);
            let restarted = self
                .overload
                .modified_at_poll
                .get(&key)
                .is_some_and(|&p| reply > p);
            if restarted {
                self.overload.modified_at_poll.remove(&key);
            }
            let prev = self.overload.meter_seen.insert(key, count).unwrap_or(0);
            let delta = if restarted || count < prev {
                count
            } else {
                count - prev
            };
            if delta == 0 {
                continue;
            }
            let total = self.overload.meter_dropped.entry(key).or_insert(0);
            *total = total.saturating_add(delta);
            let o = &mut self.overload;
            if let Some(i) = o.service_of(st.meter_id)
                && let Some(g) = o.services.get_mut(i)
            {
                g.law.record_meter_drops(delta);
                if let Some(d) = g.per_switch.get_mut(&dpid) {
                    d.dropped(delta);
                }
            }
            // Every meter here guards a rule that sends to the controller (or is the
            // controller's own): what it dropped was PACKET_IN demand.
            o.controller.record_meter_drops(delta);
            if let Some(s) = o.ctl_switches.get_mut(&dpid) {
                s.demand.dropped(delta);
            }
        }
    }

    /// The meter band installed on `dpid` for `meter`, as the controller last set it.
    pub fn installed_meter(&self, dpid: Dpid, meter: u32) -> Option<MeterBand> {
        self.overload.installed.get(&(dpid, meter)).map(|(b, _)| *b)
    }
}

/// The runtime hands the core a switch's PACKET_INs in batches (everything one read
/// brought, up to 256) that share one timestamp, so a gate sees a batch's arrivals at one
/// instant and refills only between batches. A bucket of `burst` tokens would then admit
/// about `burst` per batch whatever the gap: measured with 4 emulated switches flooding
/// at 800k/s, the controller's gate let through 7k/s under an admitted rate of 900k/s.
/// A service gate's bucket therefore also holds [`GATE_BATCH_WINDOW`] of admissions, so
/// a batch gets what its interval earned; at the gaps of seconds to tens of milliseconds
/// that service pools see, `burst` still decides.
pub(crate) fn batch_depth(burst: f64, gap: Option<Duration>) -> f64 {
    match gap {
        Some(g) if !g.is_zero() => burst.max(GATE_BATCH_WINDOW.as_secs_f64() / g.as_secs_f64()),
        _ => burst,
    }
}

/// How much time of admissions a gate's bucket holds at least (see [`batch_depth`]).
const GATE_BATCH_WINDOW: Duration = Duration::from_millis(10);

/// What a service asks of the controller's admitted rate: twice its measured demand (plus
/// one), since a quiet service's arrivals are not periodic: one that asks this much or
/// less of the fair level is not gapped (`overload_controller_gapping`).
fn ctl_demand(c: &SwitchDemand) -> f64 {
    2.0 * c.rate + 1.0
}

/// A service's load ρ: the largest of its configured ratios (1.0 = at target).
pub(crate) fn service_load(s: &ServiceState, cfg: &OverloadConfig, admitted_rate: f64) -> f64 {
    let mut load: f64 = 0.0;
    if let Some(cap) = cfg.capacity_rps {
        load = load.max(admitted_rate / cap);
    }
    if let Some(max) = cfg.max_active_connections {
        // A backend's own figure while it is fresh; once stale, the controller's count
        // where it sees every connection (reactive), else the last report stands.
        let counted = s.cfg.mode == crate::config::ServiceMode::Reactive;
        let active: f64 = s
            .backends
            .iter()
            .zip(&s.loads)
            .map(|(b, l)| match b.reported_active {
                Some(a) if l.metrics_fresh || !counted => a,
                _ => f64::from(b.active_connections),
            })
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
