//! The control channel's round trip, probed with ECHO_REQUEST (OpenFlow 1.3 §7.5.2: the
//! switch must answer each with an ECHO_REPLY carrying its xid).
//!
//! The bytes the controller has not yet written are only part of what a new flow's setup
//! waits for: once the kernel has taken them they sit, unseen, in the socket buffers and in
//! the switch's own queues (Open vSwitch under a SYN flood reads 50 messages per turn of a
//! main loop that also forwards the flood, and its PACKET_INs wait in that loop too). An
//! echo crosses all of them, in both directions, behind the messages already queued.

use std::time::{Duration, Instant};

use flowgate_core::Config;
use flowgate_core::overload::Mode;

/// The keep-alive's xid: its reply only says the switch is alive.
pub(crate) const KEEPALIVE_XID: u32 = 0xec40;
/// The probes' xid, apart from the keep-alive's.
pub(crate) const PROBE_XID: u32 = 0xec41;

/// How a session probes its channel's round trip, as the running config says.
///
/// - While the controller's overload control is adaptive, every quarter of its control
///   interval, so that each window has a few readings to take the least of. The law reads
///   them, and a switch that leaves a probe unanswered as long as the keep-alive may wait
///   is closed as dead (see `session::read_loop`).
/// - Otherwise, while passive outlier detection is told not to trust a lagging switch
///   (`[controller] outlier_max_channel_rtt_ms`), twice per that limit: the core only
///   marks the switch as lagging ([`flowgate_core::Controller::note_channel_rtt`]). No
///   liveness rule then: a switch seconds behind under a flood is alive, and closing it
///   would lose far more than a verdict.
/// - Never, with neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbePlan {
    /// The probes' period in µs (0: never).
    pub(crate) every_us: u64,
    /// For the overload control: its law reads the round trip, and an unanswered probe
    /// closes the session once older than the keep-alive's timeout.
    pub(crate) for_overload: bool,
}

impl ProbePlan {
    pub(crate) const OFF: ProbePlan = ProbePlan {
        every_us: 0,
        for_overload: false,
    };

    pub(crate) fn of(cfg: &Config) -> ProbePlan {
        let o = &cfg.controller.overload;
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if o.mode == Mode::Adaptive {
            ProbePlan {
                every_us: us(o.interval / 4),
                for_overload: true,
            }
        } else if !cfg.controller.outlier_max_channel_rtt.is_zero() {
            ProbePlan {
                every_us: us(cfg.controller.outlier_max_channel_rtt / 2).max(1),
                for_overload: false,
            }
        } else {
            ProbePlan::OFF
        }
    }

    /// As one word, for the handle's atomic (read by every session at each turn).
    pub(crate) fn bits(self) -> u64 {
        (self.every_us << 1) | u64::from(self.for_overload)
    }

    pub(crate) fn of_bits(bits: u64) -> ProbePlan {
        ProbePlan {
            every_us: bits >> 1,
            for_overload: bits & 1 == 1,
        }
    }
}

/// The probes' period for `us` µs (0: none).
fn every_of(us: u64) -> Option<Duration> {
    (us > 0).then(|| Duration::from_micros(us))
}

/// One switch's probe: at most one in flight; the next goes an interval after a reply.
#[derive(Debug, Default)]
pub(crate) struct RttProbe {
    every: Option<Duration>,
    for_overload: bool,
    next: Option<Instant>,
    in_flight: Option<Instant>,
    /// Where the probe in flight ends in the bytes queued for the switch
    /// (`Outflow::queue`), and when the writer was first seen past it.
    ends_at: u64,
    written_at: Option<Instant>,
    last: Duration,
    /// A reply came since the last [`RttProbe::report`].
    unreported: bool,
}

impl RttProbe {
    /// Follows the running config's [`ProbePlan`]: probing starts at once when turned on,
    /// and stops, forgetting what it measured, when turned off.
    pub(crate) fn set_plan(&mut self, plan: ProbePlan, now: Instant) {
        self.for_overload = plan.for_overload;
        let every = every_of(plan.every_us);
        if every == self.every {
            return;
        }
        if every.is_none() {
            *self = RttProbe::default();
            return;
        }
        self.every = every;
        self.next.get_or_insert(now);
    }

    /// Whether the probe already follows `plan`.
    pub(crate) fn follows(&self, plan: ProbePlan) -> bool {
        self.every == every_of(plan.every_us) && self.for_overload == plan.for_overload
    }

    /// Whether the probes serve the overload control (see [`ProbePlan::for_overload`]).
    pub(crate) fn for_overload(&self) -> bool {
        self.for_overload
    }

    /// When the next probe is due; `None` while one is in flight, or never probing.
    pub(crate) fn due(&self) -> Option<Instant> {
        match (self.every, self.in_flight) {
            (Some(_), None) => self.next,
            _ => None,
        }
    }

    /// A probe was queued for the switch at `now`, ending at byte `ends_at` of what was
    /// ever queued for it.
    pub(crate) fn sent(&mut self, now: Instant, ends_at: u64) {
        self.in_flight = Some(now);
        self.ends_at = ends_at;
        self.written_at = None;
    }

    /// Whether a probe is in flight and not yet seen written ([`RttProbe::observe_written`]).
    pub(crate) fn awaits_write(&self) -> bool {
        self.in_flight.is_some() && self.written_at.is_none()
    }

    /// The writer has handed the switch's socket `written` bytes so far, as seen at `now`:
    /// once past the probe in flight, its silence starts.
    pub(crate) fn observe_written(&mut self, written: u64, now: Instant) {
        if self.awaits_write() && written >= self.ends_at {
            self.written_at = Some(now);
        }
    }

    /// An ECHO_REPLY with `xid` was read at `now`: the probe's round trip when it answers
    /// the one in flight.
    pub(crate) fn answered(&mut self, xid: u32, now: Instant) {
        if xid != PROBE_XID {
            return;
        }
        if let (Some(sent), Some(every)) = (self.in_flight.take(), self.every) {
            self.last = now.saturating_duration_since(sent);
            self.next = Some(now + every);
            self.unreported = true;
        }
    }

    /// The reading at `now` for the core ([`flowgate_core::Controller::note_channel_rtt`]),
    /// when it has news: a reply since the last report, or a probe in flight longer than
    /// the probes' period (the switch is falling behind: reported at every batch while it
    /// lasts). Otherwise `None`, and the batch costs the core no lookup of its switch.
    pub(crate) fn report(&mut self, now: Instant) -> Option<Duration> {
        let overdue = self.every.is_some_and(|every| self.age(now) > every);
        if !(std::mem::take(&mut self.unreported) || overdue) {
            return None;
        }
        Some(self.reading(now))
    }

    /// The round trip as known at `now`: the last one measured, or the age of the one in
    /// flight once it is older (a switch that does not answer is at least that slow).
    pub(crate) fn reading(&self, now: Instant) -> Duration {
        self.last.max(self.age(now))
    }

    /// How long the probe in flight has gone unanswered at `now` since it was written to the
    /// switch's socket (zero with none in flight, or while it waits behind a backlog for
    /// the switch to take): the switch's silence, for its liveness. Its reading counts the
    /// wait in the queue too: that is the channel's delay.
    pub(crate) fn unanswered_for(&self, now: Instant) -> Duration {
        match (self.in_flight, self.written_at) {
            (Some(_), Some(t)) => now.saturating_duration_since(t),
            _ => Duration::ZERO,
        }
    }

    /// The age of the probe in flight (zero with none).
    fn age(&self, now: Instant) -> Duration {
        self.in_flight
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    #[cfg(test)]
    fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_measures_from_its_sending_to_its_reply() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = RttProbe::default();
        p.set_plan(
            ProbePlan {
                every_us: 25_000,
                for_overload: true,
            },
            t0,
        );
        assert_eq!(p.due(), Some(t0));
        // Queued behind 1,000 bytes for the switch: it ends at byte 1,064.
        p.sent(t0, 1_064);
        assert_eq!(p.due(), None, "one in flight at a time");
        // Unanswered, it reads at least its age, but it is not silence while the switch
        // has yet to take the bytes before it.
        p.observe_written(1_000, t0 + ms(30));
        assert_eq!(p.reading(t0 + ms(40)), ms(40));
        assert_eq!(p.unanswered_for(t0 + ms(40)), Duration::ZERO);
        // Written at 40 ms: its silence counts from there.
        p.observe_written(1_064, t0 + ms(40));
        p.observe_written(2_000, t0 + ms(42));
        assert_eq!(p.unanswered_for(t0 + ms(45)), ms(5));
        assert_eq!(p.reading(t0 + ms(45)), ms(45));
        // The keep-alive's reply is not the probe's.
        p.answered(KEEPALIVE_XID, t0 + ms(50));
        assert!(p.in_flight());
        p.answered(PROBE_XID, t0 + ms(60));
        assert!(!p.in_flight());
        assert_eq!(p.unanswered_for(t0 + ms(70)), Duration::ZERO);
        assert_eq!(p.reading(t0 + ms(70)), ms(60));
        assert_eq!(p.due(), Some(t0 + ms(85)));
        // The next one's silence is its own: written as soon as it is queued.
        p.observe_written(2_000, t0 + ms(80));
        p.sent(t0 + ms(85), 2_064);
        p.observe_written(2_064, t0 + ms(85));
        assert_eq!(p.unanswered_for(t0 + ms(86)), ms(1));
        p.answered(PROBE_XID, t0 + ms(86));
        assert_eq!(p.reading(t0 + ms(90)), ms(1));
        // The core hears of each reply once, and of a probe overdue at every batch.
        assert_eq!(p.report(t0 + ms(90)), Some(ms(1)));
        assert_eq!(p.report(t0 + ms(91)), None);
        p.sent(t0 + ms(111), 2_128);
        assert_eq!(p.report(t0 + ms(130)), None, "in flight, within its period");
        assert_eq!(
            p.report(t0 + ms(140)),
            Some(ms(29)),
            "overdue: 29 ms so far"
        );
        assert_eq!(p.report(t0 + ms(141)), Some(ms(30)));
        p.answered(PROBE_XID, t0 + ms(150));
        assert_eq!(p.report(t0 + ms(151)), Some(ms(39)));
        assert_eq!(p.report(t0 + ms(152)), None);
    }

    #[test]
    fn probing_follows_the_config() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let cfg = |toml: &str| Config::from_toml(toml, &|_| None).expect("valid");
        let plan = |toml: &str| ProbePlan::of(&cfg(toml));
        let off = plan("[controller]\noutlier_max_channel_rtt_ms = 0\n");
        let on = plan("[controller.overload]\nmode = \"adaptive\"\ninterval_ms = 40\n");
        let verdicts = plan("");
        let expected = |every_us, for_overload| ProbePlan {
            every_us,
            for_overload,
        };
        assert_eq!(off, ProbePlan::OFF);
        assert_eq!(on, expected(10_000, true));
        // The default limit, 250 ms: probed twice as often, for the verdicts only.
        assert_eq!(verdicts, expected(125_000, false));
        for p in [off, on, verdicts] {
            assert_eq!(ProbePlan::of_bits(p.bits()), p);
        }
        let mut p = RttProbe::default();
        p.set_plan(verdicts, t0);
        assert!(!p.for_overload());
        assert!(p.follows(verdicts) && !p.follows(on));
        p.set_plan(off, t0);
        assert_eq!(p.due(), None, "off: never");
        p.answered(PROBE_XID, t0);
        assert_eq!(p.reading(t0), Duration::ZERO);
        // Turned on by a reload: at once.
        p.set_plan(on, t0 + ms(5));
        assert_eq!(p.due(), Some(t0 + ms(5)));
        assert!(p.for_overload());
        p.sent(t0 + ms(5), 64);
        p.set_plan(on, t0 + ms(6));
        assert!(
            p.in_flight(),
            "the same interval leaves the probe in flight"
        );
        // Turned off: what it measured is forgotten, nothing is due.
        p.set_plan(off, t0 + ms(7));
        assert!(!p.in_flight());
        assert_eq!((p.due(), p.reading(t0 + ms(8))), (None, Duration::ZERO));
    }
}
