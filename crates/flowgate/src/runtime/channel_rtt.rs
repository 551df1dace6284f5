//! The control channel's round trip, probed with ECHO_REQUEST (OpenFlow 1.3 §7.5.2: the
//! switch must answer each with an ECHO_REPLY carrying its xid).
//!
//! The bytes the controller has not yet written are only part of what a new flow's setup
//! waits for: once the kernel has taken them they sit, unseen, in the socket buffers and in
//! the switch's own queues (Open vSwitch under a SYN flood reads 50 messages per turn of a
//! main loop that also forwards the flood, and its PACKET_INs wait in that loop too). An
//! echo crosses all of them, in both directions, behind the messages already queued.

use std::time::{Duration, Instant};

/// The probes' xid, apart from the keep-alive's (`0xec40`), whose reply only says the
/// switch is alive.
pub(crate) const PROBE_XID: u32 = 0xec41;

/// One switch's probe: at most one in flight; the next goes `every` after a reply.
#[derive(Debug)]
pub(crate) struct RttProbe {
    every: Option<Duration>,
    next: Instant,
    in_flight: Option<Instant>,
    last: Duration,
}

impl RttProbe {
    /// `every`: `None` never probes (the controller's overload control is off).
    pub(crate) fn new(every: Option<Duration>, now: Instant) -> Self {
        RttProbe {
            every,
            next: now,
            in_flight: None,
            last: Duration::ZERO,
        }
    }

    /// When the next probe is due; `None` while one is in flight, or never probing.
    pub(crate) fn due(&self) -> Option<Instant> {
        match (self.every, self.in_flight) {
            (Some(_), None) => Some(self.next),
            _ => None,
        }
    }

    /// A probe was queued for the switch at `now`.
    pub(crate) fn sent(&mut self, now: Instant) {
        self.in_flight = Some(now);
    }

    /// An ECHO_REPLY with `xid` was read at `now`: the probe's round trip when it answers
    /// the one in flight.
    pub(crate) fn answered(&mut self, xid: u32, now: Instant) {
        if xid != PROBE_XID {
            return;
        }
        if let (Some(sent), Some(every)) = (self.in_flight.take(), self.every) {
            self.last = now.saturating_duration_since(sent);
            self.next = now + every;
        }
    }

    /// The round trip as known at `now`: the last one measured, or the age of the one in
    /// flight once it is older (a switch that does not answer is at least that slow).
    pub(crate) fn reading(&self, now: Instant) -> Duration {
        let waiting = self
            .in_flight
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.last.max(waiting)
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
        let mut p = RttProbe::new(Some(ms(25)), t0);
        assert_eq!(p.due(), Some(t0));
        p.sent(t0);
        assert_eq!(p.due(), None, "one in flight at a time");
        // Unanswered, it reads at least its age.
        assert_eq!(p.reading(t0 + ms(40)), ms(40));
        // The keep-alive's reply is not the probe's.
        p.answered(0xec40, t0 + ms(50));
        assert!(p.in_flight());
        p.answered(PROBE_XID, t0 + ms(60));
        assert!(!p.in_flight());
        assert_eq!(p.reading(t0 + ms(70)), ms(60));
        assert_eq!(p.due(), Some(t0 + ms(85)));
        // A faster one replaces it.
        p.sent(t0 + ms(85));
        p.answered(PROBE_XID, t0 + ms(86));
        assert_eq!(p.reading(t0 + ms(90)), ms(1));
    }

    #[test]
    fn with_overload_control_off_nothing_is_probed() {
        let t0 = Instant::now();
        let mut p = RttProbe::new(None, t0);
        assert_eq!(p.due(), None);
        p.answered(PROBE_XID, t0);
        assert_eq!(p.reading(t0), Duration::ZERO);
    }
}
