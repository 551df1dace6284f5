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

/// How often a session probes, in µs (0: never): a quarter of the controller's control
/// interval while its overload control is adaptive, so that each window has a few readings
/// to take the least of; never while it is off (nothing reads them).
pub(crate) fn probe_interval_us(cfg: &Config) -> u64 {
    let o = &cfg.controller.overload;
    if o.mode == Mode::Adaptive {
        u64::try_from((o.interval / 4).as_micros()).unwrap_or(u64::MAX)
    } else {
        0
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
    next: Option<Instant>,
    in_flight: Option<Instant>,
    /// Time the probe in flight spent with the session not reading (see `excuse`).
    excused: Duration,
    last: Duration,
}

impl RttProbe {
    /// Follows the running config (`us` from [`probe_interval_us`]): probing starts at
    /// once when turned on, and stops, forgetting what it measured, when turned off.
    pub(crate) fn set_interval(&mut self, us: u64, now: Instant) {
        let every = every_of(us);
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

    /// Whether the probe already follows `us` (from [`probe_interval_us`]).
    pub(crate) fn follows(&self, us: u64) -> bool {
        self.every == every_of(us)
    }

    /// When the next probe is due; `None` while one is in flight, or never probing.
    pub(crate) fn due(&self) -> Option<Instant> {
        match (self.every, self.in_flight) {
            (Some(_), None) => self.next,
            _ => None,
        }
    }

    /// A probe was queued for the switch at `now`.
    pub(crate) fn sent(&mut self, now: Instant) {
        self.in_flight = Some(now);
        self.excused = Duration::ZERO;
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
        }
    }

    /// The round trip as known at `now`: the last one measured, or the age of the one in
    /// flight once it is older (a switch that does not answer is at least that slow).
    pub(crate) fn reading(&self, now: Instant) -> Duration {
        self.last.max(self.age(now))
    }

    /// The session read nothing for `d` (it waited for the switch to take its bytes): a
    /// reply that came meanwhile waits unread, so the probe in flight is not held to that
    /// time as unanswered ([`RttProbe::unanswered_for`]); its reading still counts it.
    pub(crate) fn excuse(&mut self, d: Duration) {
        if self.in_flight.is_some() {
            self.excused += d;
        }
    }

    /// How long the probe in flight has gone unanswered at `now` while the session read
    /// (zero with none in flight): the switch's silence, for its liveness.
    pub(crate) fn unanswered_for(&self, now: Instant) -> Duration {
        self.age(now).saturating_sub(self.excused)
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
        p.set_interval(25_000, t0);
        assert_eq!(p.due(), Some(t0));
        p.sent(t0);
        assert_eq!(p.due(), None, "one in flight at a time");
        // Unanswered, it reads at least its age.
        assert_eq!(p.reading(t0 + ms(40)), ms(40));
        assert_eq!(p.unanswered_for(t0 + ms(40)), ms(40));
        // While the session did not read, a reply could not be seen: its silence is
        // excused, not its round trip.
        p.excuse(ms(30));
        assert_eq!(p.unanswered_for(t0 + ms(45)), ms(15));
        assert_eq!(p.reading(t0 + ms(45)), ms(45));
        // The keep-alive's reply is not the probe's.
        p.answered(KEEPALIVE_XID, t0 + ms(50));
        assert!(p.in_flight());
        p.answered(PROBE_XID, t0 + ms(60));
        assert!(!p.in_flight());
        assert_eq!(p.unanswered_for(t0 + ms(70)), Duration::ZERO);
        assert_eq!(p.reading(t0 + ms(70)), ms(60));
        assert_eq!(p.due(), Some(t0 + ms(85)));
        // A faster one replaces it.
        p.excuse(ms(50));
        p.sent(t0 + ms(85));
        assert_eq!(
            p.unanswered_for(t0 + ms(86)),
            ms(1),
            "an excuse is for the probe in flight only"
        );
        p.answered(PROBE_XID, t0 + ms(86));
        assert_eq!(p.reading(t0 + ms(90)), ms(1));
    }

    #[test]
    fn probing_follows_the_overload_controls_mode() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let cfg = |toml: &str| Config::from_toml(toml, &|_| None).expect("valid");
        let off = probe_interval_us(&cfg(""));
        let on = probe_interval_us(&cfg(
            "[controller.overload]\nmode = \"adaptive\"\ninterval_ms = 40\n",
        ));
        assert_eq!((off, on), (0, 10_000));
        let mut p = RttProbe::default();
        p.set_interval(off, t0);
        assert_eq!(p.due(), None, "off: never");
        p.answered(PROBE_XID, t0);
        assert_eq!(p.reading(t0), Duration::ZERO);
        // Turned on by a reload: at once.
        p.set_interval(on, t0 + ms(5));
        assert_eq!(p.due(), Some(t0 + ms(5)));
        p.sent(t0 + ms(5));
        p.set_interval(on, t0 + ms(6));
        assert!(
            p.in_flight(),
            "the same interval leaves the probe in flight"
        );
        // Turned off: what it measured is forgotten, nothing is due.
        p.set_interval(off, t0 + ms(7));
        assert!(!p.in_flight());
        assert_eq!((p.due(), p.reading(t0 + ms(8))), (None, Duration::ZERO));
    }
}
