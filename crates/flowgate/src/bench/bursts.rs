//! Where a latency tail comes from: the slow setups of a run, grouped into bursts by
//! when they were sent.
//!
//! A p99 alone cannot tell a controller that queues steadily from a machine that
//! stalls now and then. On this shared two-core VM, much of the open loop's tail comes in
//! bursts in which every switch's setups slow down at once, for 0.4–25 ms, while the
//! controller's own handling of a batch (its lock held) went over 200 µs only 4–7 times in
//! a run (timed with a throwaway patch, `docs/benchmarks.md`, stop 10). The report says,
//! run by run, how many of the slow setups came in such bursts.

use std::time::{Duration, Instant};

/// A setup over this long is "slow": the bound of #8's latency target.
pub const SLOW: Duration = Duration::from_micros(100);

/// Slow setups sent less than this apart belong to one burst.
pub const BURST_GAP: Duration = Duration::from_millis(1);

/// A probe sent this far behind the open-loop schedule went out in the bench's catch-up
/// after a pause of its own: it reached the controller in a burst the schedule did not
/// offer.
pub const SENT_LATE: Duration = Duration::from_micros(100);

/// Slow setups each emulated switch keeps (16 bytes each): beyond it, a run's bursts
/// are summarised from its first ones (`Bursts::capped`).
pub const KEEP_PER_SWITCH: usize = 250_000;

/// One slow setup: when its probe was sent, and by which switch (its index in the run).
pub type Slow = (Instant, u16);

/// The slow setups of a run, grouped into bursts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Bursts {
    /// Slow setups (over [`SLOW`]) looked at.
    pub slow: u64,
    /// Groups of slow setups sent less than [`BURST_GAP`] apart.
    pub bursts: usize,
    /// Bursts in which every switch of the run had a slow setup: the machine or the
    /// controller stalled for all of them at once.
    pub everywhere: usize,
    /// Slow setups inside those bursts.
    pub slow_everywhere: u64,
    /// From the first slow setup's send to the last one's, in the longest burst.
    pub longest: Duration,
    /// Some switch kept only its first [`KEEP_PER_SWITCH`] slow setups.
    pub capped: bool,
    /// Open loop: slow setups (all of them, not only those kept) whose probe was sent over
    /// [`SENT_LATE`] behind the schedule.
    pub sent_late: Option<u64>,
}

impl Bursts {
    /// Group `slow` (any order) from a run of `switches` switches.
    pub fn of(mut slow: Vec<Slow>, switches: usize, capped: bool) -> Bursts {
        slow.sort_unstable_by_key(|s| s.0);
        let mut out = Bursts {
            slow: slow.len() as u64,
            capped,
            ..Bursts::default()
        };
        let mut seen = vec![false; switches];
        let close = |burst: &[Slow], seen: &mut [bool], out: &mut Bursts| {
            let (Some(first), Some(last)) = (burst.first(), burst.last()) else {
                return;
            };
            out.bursts += 1;
            out.longest = out.longest.max(last.0.duration_since(first.0));
            if !seen.is_empty() && seen.iter().all(|&s| s) {
                out.everywhere += 1;
                out.slow_everywhere += burst.len() as u64;
            }
            seen.iter_mut().for_each(|s| *s = false);
        };
        let mut start = 0;
        for i in 0..slow.len() {
            if i > start && slow[i].0.duration_since(slow[i - 1].0) >= BURST_GAP {
                close(&slow[start..i], &mut seen, &mut out);
                start = i;
            }
            if let Some(s) = seen.get_mut(usize::from(slow[i].1)) {
                *s = true;
            }
        }
        close(&slow[start..], &mut seen, &mut out);
        out
    }

    /// One sentence for the report, given the run's setups with a latency.
    pub fn sentence(&self, measured: u64, switches: usize) -> String {
        if self.slow == 0 {
            return format!("no setup took over {} µs", SLOW.as_micros());
        }
        let share = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
        format!(
            "{} setups over {} µs ({:.2} % of {}){}, in {} bursts (slow setups sent under {} ms \
             apart); {} of the bursts reached all {} switches at once and hold {:.0} % of the \
             slow setups; the longest spanned {:.1} ms",
            super::fmt_rate(self.slow as f64),
            SLOW.as_micros(),
            share(self.slow, measured),
            super::fmt_rate(measured as f64),
            if self.capped {
                " (bursts from each switch's first 250,000)"
            } else {
                ""
            },
            self.bursts,
            BURST_GAP.as_millis(),
            self.everywhere,
            switches,
            share(self.slow_everywhere, self.slow),
            self.longest.as_secs_f64() * 1e3,
        ) + &match self.sent_late {
            Some(n) => format!(
                "; {:.0} % of them were sent over {} µs behind the schedule (the bench's \
                 catch-up after a pause of its own)",
                share(n, self.slow),
                SENT_LATE.as_micros()
            ),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, us: u64, switch: u16) -> Slow {
        (t0 + Duration::from_micros(us), switch)
    }

    #[test]
    fn slow_setups_group_by_the_gap_between_sends() {
        let t0 = Instant::now();
        // Burst 1: both switches, 0..=900 µs. Burst 2: switch 1 only, 5 ms on.
        // Burst 3: a lone setup 1 ms after burst 2's last (the gap is inclusive).
        let slow = vec![
            at(t0, 900, 1),
            at(t0, 0, 0),
            at(t0, 400, 0),
            at(t0, 5_000, 1),
            at(t0, 5_300, 1),
            at(t0, 6_300, 0),
        ];
        let b = Bursts::of(slow, 2, false);
        assert_eq!(
            b,
            Bursts {
                slow: 6,
                bursts: 3,
                everywhere: 1,
                slow_everywhere: 3,
                longest: Duration::from_micros(900),
                capped: false,
                sent_late: None,
            }
        );
        let s = b.sentence(600, 2);
        assert!(s.starts_with("6 setups over 100 µs (1.00 % of 600)"), "{s}");
        assert!(s.contains("1 of the bursts reached all 2 switches at once and hold 50 %"));
        assert!(!s.contains("behind the schedule"), "{s}");
        // Open loop: the share of them the bench sent late.
        let late = Bursts {
            sent_late: Some(3),
            ..b
        };
        let s = late.sentence(600, 2);
        assert!(
            s.ends_with("; 50 % of them were sent over 100 µs behind the schedule (the bench's catch-up after a pause of its own)"),
            "{s}"
        );
    }

    #[test]
    fn no_slow_setup_is_said_plainly() {
        let b = Bursts::of(Vec::new(), 16, false);
        assert_eq!(b.bursts, 0);
        assert_eq!(b.sentence(1000, 16), "no setup took over 100 µs");
    }

    #[test]
    fn a_switch_outside_the_run_counts_for_no_switch() {
        let t0 = Instant::now();
        let b = Bursts::of(vec![at(t0, 0, 0), at(t0, 10, 7)], 1, true);
        assert_eq!((b.bursts, b.everywhere, b.capped), (1, 1, true));
    }
}
