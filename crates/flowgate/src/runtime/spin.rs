//! Polling before the runtime's worker sleeps (`[runtime] spin_before_park_us`): the
//! worker, out of tasks, watches the switches' sockets for up to a budget before it
//! blocks, as Go's scheduler spins before it parks a processor and Linux's `haltpoll`
//! polls before it halts a guest CPU.
//!
//! Why: a worker that blocks in `epoll_wait` puts its CPU to sleep, and the next
//! PACKET_IN pays for waking it: the switch's write has to wake the thread, and on a
//! virtual machine a halted virtual CPU waits for the hypervisor to run it again (tens of
//! microseconds to milliseconds). Under a steady load a batch arrives a few tens of
//! microseconds after the last one was answered, so the wake-up is most of a setup's
//! latency. A worker that polls for a little longer than that gap never sleeps while the
//! load lasts, and reads each batch as it arrives.
//!
//! What it costs: CPU while idle, at most the budget per park (a park is when the
//! worker ran out of tasks, so never at the peak, when there is always a batch waiting),
//! and each of its polls is one `epoll_wait` with a zero timeout. A timer or a task woken
//! from another thread waits for the poll to end, at most the budget. Off by default:
//! for a controller with CPUs of its own.
//!
//! How: a second epoll instance holds every switch socket, level-triggered, besides
//! tokio's. The runtime's `on_thread_park` hook polls it until a socket is readable or
//! the budget is spent; tokio's own `epoll_wait` then finds the event at once instead of
//! sleeping. The kernel drops a socket from the set when the socket is closed. A socket
//! that its session has stopped reading (a switch that does not take its answers) stays
//! readable: the poll then ends at once, and the worker sleeps as it would without it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::event::epoll;

/// The most `spin_before_park_us` may be: beyond a few milliseconds, polling is sleeping
/// made expensive.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// Hook a poller of `budget` into `runtime`'s workers; none for a zero budget. The
/// caller has it watch the sockets it accepts ([`ParkSpin::watch`]).
pub fn hook(
    runtime: &mut tokio::runtime::Builder,
    budget: Duration,
) -> std::io::Result<Option<Arc<ParkSpin>>> {
    if budget.is_zero() {
        return Ok(None);
    }
    let spin = Arc::new(ParkSpin::new(budget)?);
    let hooked = spin.clone();
    runtime.on_thread_park(move || {
        hooked.before_park();
    });
    Ok(Some(spin))
}

/// The sockets to watch and how long to watch them.
#[derive(Debug)]
pub struct ParkSpin {
    epoll: OwnedFd,
    budget: Duration,
    /// Polls that ended with a socket readable, and with the budget spent (what
    /// `/metrics` shows, to tune the budget by).
    readable: AtomicU64,
    spent: AtomicU64,
}

impl ParkSpin {
    /// Poll for up to `budget` (at most [`MAX_SPIN`]) before each park.
    pub fn new(budget: Duration) -> std::io::Result<Self> {
        Ok(ParkSpin {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            budget: budget.min(MAX_SPIN),
            readable: AtomicU64::new(0),
            spent: AtomicU64::new(0),
        })
    }

    /// Watch `socket` for bytes to read (until it is closed).
    pub fn watch(&self, socket: impl AsFd) -> std::io::Result<()> {
        epoll::add(
            &self.epoll,
            socket,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        Ok(())
    }

    /// Polls so far that ended with a socket readable, and with the budget spent.
    pub fn ends(&self) -> (u64, u64) {
        (
            self.readable.load(Ordering::Relaxed),
            self.spent.load(Ordering::Relaxed),
        )
    }

    /// The `on_thread_park` hook: return when a watched socket is readable, or when the
    /// budget is spent (or the poll fails: the worker then parks as it would have).
    pub fn before_park(&self) -> SpinEnd {
        let start = Instant::now();
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut events = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }];
        loop {
            match epoll::wait(&self.epoll, &mut events, Some(&zero)) {
                Ok(0) => {}
                Ok(_) => {
                    self.readable.fetch_add(1, Ordering::Relaxed);
                    return SpinEnd::Readable;
                }
                Err(e) => return SpinEnd::Failed(e),
            }
            if start.elapsed() >= self.budget {
                self.spent.fetch_add(1, Ordering::Relaxed);
                return SpinEnd::Spent;
            }
            std::hint::spin_loop();
        }
    }
}

/// Why a poll before parking ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinEnd {
    /// A switch's socket has bytes to read.
    Readable,
    /// Nothing came within the budget: the worker sleeps.
    Spent,
    /// `epoll_wait` failed: the worker sleeps.
    Failed(rustix::io::Errno),
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn ends_for_a_readable_socket_and_after_the_budget_otherwise() {
        let budget = Duration::from_millis(5);
        let spin = ParkSpin::new(budget).expect("epoll");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        spin.watch(&server).expect("watch");

        // Nothing to read: the whole budget.
        let t = Instant::now();
        assert_eq!(spin.before_park(), SpinEnd::Spent);
        assert!(t.elapsed() >= budget);

        // Bytes waiting (loopback delivers them before `write` returns).
        client.write_all(b"x").expect("write");
        assert_eq!(spin.before_park(), SpinEnd::Readable);

        // Closed: the kernel forgets the socket, and the poll runs out its budget again.
        drop(server);
        assert_eq!(spin.before_park(), SpinEnd::Spent);
        assert_eq!(spin.ends(), (1, 2));
    }

    #[test]
    fn the_budget_is_capped() {
        let spin = ParkSpin::new(Duration::from_secs(5)).expect("epoll");
        assert_eq!(spin.budget, MAX_SPIN);
    }
}
