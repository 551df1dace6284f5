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

/// The probes' period while the overload control is not adaptive: the session's own
/// bound on its switch's delay (`openflow.max_channel_delay_ms`) reads them. A probe in
/// flight reads at least its age, so a backlog is seen as it grows; this only bounds how
/// stale the reading of a quick channel is.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(100);

/// How often a session probes, in µs (never 0 from a config): a quarter of the
/// controller's control interval while its overload control is adaptive, so that each
/// window has a few readings to take the least of; [`PROBE_EVERY`] otherwise.
pub(crate) fn probe_interval_us(cfg: &Config) -> u64 {
    let o = &cfg.controller.overload;
    let every = if o.mode == Mode::Adaptive {
        o.interval / 4
    } else {
        PROBE_EVERY
    };
    u64::try_from(every.as_micros()).unwrap_or(u64::MAX).max(1)
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
    /// Where the probe in flight ends in the bytes queued for the switch
    /// (`Outflow::queue`), and when the writer was first seen past it.
    ends_at: u64,
    written_at: Option<Instant>,
    last: Duration,
    /// Where the last probe answered ended in the stream, and when its reply came: the
    /// switch had worked through that many bytes by then.
    last_reply: Option<(u64, Instant)>,
    /// Bytes a second the switch works through, from the last two replies that found it
    /// busy (see [`RttProbe::answered`]); `None` until then, or once it proved quicker.
    rate: Option<f64>,
    /// What [`RttProbe::predicted`] said of the probe in flight when it was sent.
    expected: Duration,
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

    /// A probe was queued for the switch at `now`, ending at byte `ends_at` of what was
    /// ever queued for it.
    pub(crate) fn sent(&mut self, now: Instant, ends_at: u64) {
        self.expected = self.predicted(now, || ends_at);
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
            // A probe that waited longer than the pause before it was sent found the switch
            // busy, all the while since the reply before but for that pause: the bytes
            // between the two are what it worked through meanwhile, its rate (low by at
            // most the pause's share, half). One answered in under half the wait its rate
            // foretold shows the switch quicker than that: the rate is dropped, not kept
            // to hold the switch to it. Otherwise the switch kept up, and its rate stands.
            let busy = self.last > every;
            match self.last_reply {
                Some((ended, at)) if busy && self.ends_at > ended => {
                    let secs = now.saturating_duration_since(at).as_secs_f64();
                    if secs > 0.0 {
                        self.rate = Some((self.ends_at - ended) as f64 / secs);
                    }
                }
                _ if self.last < self.expected / 2 => self.rate = None,
                _ => {}
            }
            self.last_reply = Some((self.ends_at, now));
        }
    }

    /// How long bytes queued now, ending at `stream_end` in the stream, will wait for the
    /// switch to get to them, at least: what the probe's reading would say of them once
    /// answered, known before they age. A flood that outruns the switch makes this grow as
    /// fast as the answers are queued, where the probe in flight ages only with the clock;
    /// bounding its age alone let the wait overshoot the bound by the flood's excess (in
    /// `a_switch_slow_behind_its_socket_buffers_…`, 1.4 s for a bound of 200 ms).
    ///
    /// The larger of two readings, zero with neither:
    /// - with a probe in flight for `age`, behind `ahead` bytes the switch had yet to work
    ///   through when it was sent (those since the last reply): the switch works slower
    ///   than `ahead / age`, so the bytes after the probe wait at least
    ///   `age × after / ahead`, whatever its rate;
    /// - at the rate it was last seen working, the bytes since the last reply, less the
    ///   time since it.
    ///
    /// `stream_end` is asked only when either applies.
    pub(crate) fn predicted(&self, now: Instant, stream_end: impl FnOnce() -> u64) -> Duration {
        if self.rate.is_none() && self.in_flight.is_none() {
            return Duration::ZERO;
        }
        let end = stream_end();
        let (ended, at) = self.last_reply.unwrap_or((0, now));
        let mut wait: f64 = 0.0;
        if let Some(sent) = self.in_flight {
            let ahead = self.ends_at.saturating_sub(ended);
            let after = end.saturating_sub(self.ends_at);
            if ahead > 0 {
                let age = now.saturating_duration_since(sent).as_secs_f64();
                wait = age * after as f64 / ahead as f64;
            }
        }
        if let Some(rate) = self.rate {
            let since = now.saturating_duration_since(at).as_secs_f64();
            wait = wait.max(end.saturating_sub(ended) as f64 / rate - since);
        }
        Duration::from_secs_f64(wait.clamp(0.0, 3600.0))
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
        p.set_interval(25_000, t0);
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
    }

    #[test]
    fn the_wait_of_what_is_queued_is_foretold_from_the_probe_and_the_switchs_pace() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |d: u64| t0 + ms(d);
        let mut p = RttProbe::default();
        p.set_interval(100_000, t0);
        // Nothing in flight and no pace known: nothing foretold, and the stream's end is
        // not asked (the writer's count is not loaded).
        p.sent(at(0), 1_000);
        p.answered(PROBE_XID, at(1));
        assert_eq!(p.predicted(at(2), || unreachable!()), Duration::ZERO);
        // A probe behind 50,000 unanswered bytes, 100 ms old, with 100,000 queued after
        // it: the switch works under 500,000 bytes a second, so those wait 200 ms at least.
        p.sent(at(101), 51_000);
        assert_eq!(p.predicted(at(201), || 151_000).as_millis(), 200);
        assert_eq!(
            p.reading(at(201)),
            ms(100),
            "the probe's own age reads less"
        );
        // Answered after 200 ms, longer than the pause before it: the switch was busy, and
        // worked through 50,000 bytes in the 300 ms between the replies.
        p.answered(PROBE_XID, at(301));
        assert_eq!(p.predicted(at(301), || 151_000).as_millis(), 600);
        assert_eq!(p.predicted(at(601), || 151_000).as_millis(), 300);
        assert_eq!(p.predicted(at(1_000), || 151_000), Duration::ZERO);
        // The next probe foretold to wait 500 ms comes back in 1: the switch is quicker
        // than its last pace, which is dropped rather than held to.
        p.sent(at(401), 151_008);
        p.answered(PROBE_XID, at(402));
        assert_eq!(p.predicted(at(402), || 400_000), Duration::ZERO);
        // One that waits no longer than the pause leaves a known pace as it was.
        p.sent(at(502), 151_016);
        p.answered(PROBE_XID, at(560));
        p.sent(at(660), 201_016);
        p.answered(PROBE_XID, at(960));
        let pace = 50_000.0 / 0.4;
        p.sent(at(1_060), 201_024);
        p.answered(PROBE_XID, at(1_100));
        let foretold = p.predicted(at(1_100), || 201_024 + 50_000).as_secs_f64();
        assert!((foretold - 50_000.0 / pace).abs() < 0.001, "{foretold}");
    }

    #[test]
    fn probing_follows_the_overload_controls_mode() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let cfg = |toml: &str| Config::from_toml(toml, &|_| None).expect("valid");
        // Off, the session's delay bound still reads them, at its own pace.
        let off = probe_interval_us(&cfg(""));
        let on = probe_interval_us(&cfg(
            "[controller.overload]\nmode = \"adaptive\"\ninterval_ms = 40\n",
        ));
        assert_eq!((off, on), (100_000, 10_000));
        let mut p = RttProbe::default();
        p.set_interval(0, t0);
        assert_eq!(p.due(), None, "0: never");
        p.answered(PROBE_XID, t0);
        assert_eq!(p.reading(t0), Duration::ZERO);
        // Turned on: at once.
        p.set_interval(off, t0 + ms(5));
        assert_eq!(p.due(), Some(t0 + ms(5)));
        p.sent(t0 + ms(5), 64);
        // A reload that changes the pace leaves the probe in flight, and the next goes
        // at the new pace after its reply.
        p.set_interval(on, t0 + ms(6));
        assert!(p.in_flight(), "a new pace leaves the probe in flight");
        p.answered(PROBE_XID, t0 + ms(7));
        assert_eq!(p.due(), Some(t0 + ms(17)));
        // Turned off: what it measured is forgotten, nothing is due.
        p.set_interval(0, t0 + ms(8));
        assert!(!p.in_flight());
        assert_eq!((p.due(), p.reading(t0 + ms(8))), (None, Duration::ZERO));
    }
}
