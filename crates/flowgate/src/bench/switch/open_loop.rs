//! The open-loop schedule of `Pace::Rate`: when each switch's probes fall due, and the
//! thread that wakes the switches for them on a timerfd.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::RunFlags;

/// The open-loop schedule of a group of switches, whatever the answers do: probe `j` of
/// the group is due `j / rate` seconds after the start; probes go in batches of `batch`
/// consecutive ones (about `STEP`'s worth), batch `g` from switch `g mod n`, all of it
/// when its first probe falls due.
///
/// tokio's timers step in whole milliseconds, which sent every switch's millisecond of
/// probes at once (at 260,000/s, 260 at the controller together every millisecond: the
/// latency measured that burst). Here the switches take turns: at 260,000/s a batch of
/// 16 every 62 µs, with 16 switches as many probes per write as before (the controller's
/// and the bench's CPU per setup depend on it), but never more than one batch at once.
/// Each switch sends
/// its batches as they fall due whenever it runs anyway (reading answers), and a thread
/// of its own wakes those that have a batch due and did not run, on a timerfd: exact to
/// microseconds where a timeout in tokio's reactor rounds to a millisecond.
pub struct OpenLoop {
    pub(super) rate: f64,
    pub(super) batch: u64,
    pub(super) slots: Vec<Slot>,
    /// When probe 0 was due (set by the stepping thread at `RunFlags::go`).
    pub(super) start: std::sync::OnceLock<Instant>,
    /// The switches are gone: stop stepping (as at `RunFlags::stop`).
    pub(super) done: AtomicBool,
}

#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Probes of this switch sent (or dropped, its queue full) so far.
    taken: AtomicU64,
    wake: tokio::sync::Notify,
}

/// The schedule's step: a batch per step, of as many probes as fall due in it, one
/// probe at least (below 16,000/s, a probe per step at its exact time).
const STEP: Duration = Duration::from_micros(62);
/// The stepping thread's longest sleep: it notices the end of the run within this.
const MAX_STEP: Duration = Duration::from_millis(10);

impl OpenLoop {
    /// `rate` probes per second over `switches` switches.
    pub fn new(rate: f64, switches: usize) -> Arc<OpenLoop> {
        let rate = rate.max(1e-3);
        Arc::new(OpenLoop {
            rate,
            batch: (rate * STEP.as_secs_f64()).round().max(1.0) as u64,
            slots: (0..switches.max(1)).map(|_| Slot::default()).collect(),
            start: std::sync::OnceLock::new(),
            done: AtomicBool::new(false),
        })
    }

    /// Step the schedule from `flags.go` until `flags.stop` (or [`OpenLoop::finish`]), on
    /// a thread of its own (`spawn_blocking`), or, `busy`, in a task of the switches'
    /// runtime that never lets it sleep (see `drive_busy`).
    pub fn spawn(
        self: &Arc<Self>,
        flags: Arc<RunFlags>,
        busy: bool,
    ) -> tokio::task::JoinHandle<Result<(), String>> {
        let this = self.clone();
        if busy {
            tokio::spawn(async move { this.drive_busy(&flags).await })
        } else {
            tokio::task::spawn_blocking(move || this.drive(&flags))
        }
    }

    /// Wake the switches with probes due by `now` that were not woken for them yet.
    fn wake_due(&self, woken: &mut [u64], now: Instant) {
        for (i, (s, w)) in self.slots.iter().zip(woken).enumerate() {
            let due = self.due(i, now);
            if due > s.taken.load(Ordering::Relaxed).max(*w) {
                *w = due;
                s.wake.notify_one();
            }
        }
    }

    /// The switches are done with the schedule.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    fn over(&self, flags: &RunFlags) -> bool {
        flags.stop.load(Ordering::Relaxed) || self.done.load(Ordering::Relaxed)
    }

    /// Probes of switch `i` due by `now` since the start (all of them, sent or not).
    pub(super) fn due(&self, i: usize, now: Instant) -> u64 {
        let Some(start) = self.start.get() else {
            return 0;
        };
        // Probe j is the last one due; batches 0..=j / batch have started.
        let j = (now.saturating_duration_since(*start).as_secs_f64() * self.rate) as u64;
        let (g, n, i) = (j / self.batch, self.slots.len() as u64, i as u64);
        // Batch g is switch g mod n's.
        let batches = if g >= i { (g - i) / n + 1 } else { 0 };
        batches * self.batch
    }

    fn drive(&self, flags: &RunFlags) -> Result<(), String> {
        while !flags.go.load(Ordering::Relaxed) {
            if self.over(flags) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let step = Duration::from_secs_f64(self.batch as f64 / self.rate).min(MAX_STEP);
        let timer = step_timer(step).map_err(|e| format!("open-loop timer: {e}"))?;
        let _ = self.start.set(Instant::now());
        // Per switch, the probes it was last woken for: no second wake-up for them.
        let mut woken = vec![0u64; self.slots.len()];
        let mut expirations = [0u8; 8];
        while !self.over(flags) {
            self.wake_due(&mut woken, Instant::now());
            // Blocks until the next expiry; their count is not needed (the clock is read).
            rustix::io::read(&timer, &mut expirations[..])
                .map_err(|e| format!("open-loop timer: {e}"))?;
        }
        Ok(())
    }

    /// The schedule stepped by the switches' own thread, polling: after each look at the
    /// clock it yields, and tokio then polls its reactor without blocking before it runs
    /// the task again. The thread never sleeps, so neither a timer nor an answer from the
    /// controller has to wake it: the controller's write of an answer does not pay for
    /// waking the bench (on a VM, an interrupt to the other CPU), and the bench reads it
    /// at once. It takes the whole of its CPU (`--busy-poll` needs `--pin`).
    async fn drive_busy(&self, flags: &RunFlags) -> Result<(), String> {
        while !flags.go.load(Ordering::Relaxed) {
            if self.over(flags) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = self.start.set(Instant::now());
        let mut woken = vec![0u64; self.slots.len()];
        while !self.over(flags) {
            self.wake_due(&mut woken, Instant::now());
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    /// How late switch `i` is, at `now`, with the oldest of its probes that fell due and
    /// were not taken yet: `now` less the time its batch fell due (`None` if none is due).
    /// A probe's latency counts from when it was sent, so this is what the bench itself
    /// (its thread, its CPU) added before the controller could see the probe.
    pub(super) fn lag(&self, i: usize, now: Instant) -> Option<Duration> {
        let taken = self.slots.get(i)?.taken.load(Ordering::Relaxed);
        if self.due(i, now) <= taken {
            return None;
        }
        Some(now.saturating_duration_since(self.due_at(i, taken)?))
    }

    /// When switch `i`'s probe number `k` (counting from 0, all it took) fell due on the
    /// schedule (`None` before the start).
    pub(super) fn due_at(&self, i: usize, k: u64) -> Option<Instant> {
        let start = *self.start.get()?;
        // Probe k is in the switch's (k / batch)-th batch, which is batch g of the whole
        // schedule; a batch falls due with its first probe, the schedule's g * batch.
        let n = self.slots.len() as u64;
        let g = i as u64 + k / self.batch * n;
        Some(start + Duration::from_secs_f64((g * self.batch) as f64 / self.rate))
    }

    /// Switch `i` sends its probes due by `now`: how many (at most 100,000 at once, so a
    /// stalled bench catches up over several turns).
    pub(super) fn take(&self, i: usize, now: Instant) -> u64 {
        let Some(s) = self.slots.get(i) else {
            return 0;
        };
        let taken = s.taken.load(Ordering::Relaxed);
        let k = self.due(i, now).saturating_sub(taken).min(100_000);
        s.taken.store(taken + k, Ordering::Relaxed);
        k
    }

    async fn woken(&self, i: usize) {
        match self.slots.get(i) {
            Some(s) => s.wake.notified().await,
            None => std::future::pending().await,
        }
    }
}

/// Wakes when the open-loop schedule has probes for this switch (never without one).
pub(super) async fn probes_due(open: Option<&(Arc<OpenLoop>, usize)>) {
    match open {
        Some((o, i)) => o.woken(*i).await,
        None => std::future::pending().await,
    }
}

/// A periodic timerfd, read blocking: its expiries are exact (timer slack applies to
/// sleeps and timeouts, not to it).
fn step_timer(step: Duration) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};
    let fd = rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)?;
    let ts = rustix::time::Timespec::try_from(step)
        .map_err(|_| std::io::Error::other("step out of range"))?;
    rustix::time::timerfd_settime(
        &fd,
        TimerfdTimerFlags::empty(),
        &Itimerspec {
            it_interval: ts,
            it_value: ts,
        },
    )?;
    Ok(fd)
}
