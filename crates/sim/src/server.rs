//! A backend server: `workers` requests in service at once, each for an exponentially
//! distributed time (mean `service / speed`), a FIFO queue of at most `backlog` behind
//! them (as a web server's accept queue), and a request refused beyond that. It keeps the
//! figures a backend's metrics endpoint would show the controller: its completion rate,
//! requests in it, busy share and response time, smoothed.

use std::collections::VecDeque;

/// Time constant of the smoothed rate and busy share (the controller's own is 1 s).
const SMOOTHING_NS: f64 = 1e9;
/// Weight of a new response time in its moving average.
const RT_WEIGHT: f64 = 0.05;

#[derive(Debug, Clone)]
pub struct Server {
    pub workers: u32,
    /// Mean service time in ns at this server's speed.
    pub mean_service_ns: f64,
    pub backlog: u32,
    pub busy: u32,
    /// Requests waiting, by connection (the engine keeps when each arrived).
    pub queue: VecDeque<u64>,
    /// Worker-nanoseconds busy, in all, and at the last change.
    pub busy_ns: f64,
    last_change: u64,
    /// Smoothed completions a second, and busy share.
    pub rps: f64,
    pub cpu: f64,
    /// Moving average of the response time (queue and service), ms.
    pub rt_ms: Option<f64>,
    last_report: u64,
    done_since_report: u64,
    busy_at_report: f64,
    pub served: u64,
    pub refused: u64,
}

/// What happened to a request that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// A worker took it at once.
    Started,
    /// It waits in the queue.
    Queued,
    /// The queue is full: refused.
    Refused,
}

impl Server {
    pub fn new(workers: u32, mean_service_ns: f64, backlog: u32) -> Self {
        Server {
            workers,
            mean_service_ns,
            backlog,
            busy: 0,
            queue: VecDeque::new(),
            busy_ns: 0.0,
            last_change: 0,
            rps: 0.0,
            cpu: 0.0,
            rt_ms: None,
            last_report: 0,
            done_since_report: 0,
            busy_at_report: 0.0,
            served: 0,
            refused: 0,
        }
    }

    /// Requests per second it completes when all its workers are busy.
    pub fn capacity(&self) -> f64 {
        f64::from(self.workers) * 1e9 / self.mean_service_ns
    }

    /// Bring the busy time up to `now`.
    pub fn settle(&mut self, now: u64) {
        self.account(now);
    }

    fn account(&mut self, now: u64) {
        self.busy_ns += f64::from(self.busy) * now.saturating_sub(self.last_change) as f64;
        self.last_change = now;
    }

    /// A request of connection `conn` arrives at `now`.
    pub fn arrive(&mut self, now: u64, conn: u64) -> Admit {
        self.account(now);
        if self.busy < self.workers {
            self.busy += 1;
            Admit::Started
        } else if (self.queue.len() as u32) < self.backlog {
            self.queue.push_back(conn);
            Admit::Queued
        } else {
            self.refused += 1;
            Admit::Refused
        }
    }

    /// A request that arrived at `arrived` completes at `now`; the next one waiting, if
    /// any, starts (its connection).
    pub fn complete(&mut self, now: u64, arrived: u64) -> Option<u64> {
        self.account(now);
        self.served += 1;
        self.done_since_report += 1;
        let rt = now.saturating_sub(arrived) as f64 / 1e6;
        self.rt_ms = Some(self.rt_ms.map_or(rt, |a| a + RT_WEIGHT * (rt - a)));
        match self.queue.pop_front() {
            Some(next) => Some(next),
            None => {
                self.busy = self.busy.saturating_sub(1);
                None
            }
        }
    }

    /// Requests in it: in service and waiting.
    pub fn active(&self) -> u32 {
        self.busy + self.queue.len() as u32
    }

    /// Bring the smoothed figures up to `now` (a metrics scrape).
    pub fn report(&mut self, now: u64) {
        self.account(now);
        let dt = now.saturating_sub(self.last_report) as f64;
        if dt <= 0.0 {
            return;
        }
        let a = 1.0 - (-dt / SMOOTHING_NS).exp();
        let rate = self.done_since_report as f64 * 1e9 / dt;
        let cpu = (self.busy_ns - self.busy_at_report) / (dt * f64::from(self.workers.max(1)));
        self.rps += a * (rate - self.rps);
        self.cpu += a * (cpu - self.cpu);
        self.last_report = now;
        self.done_since_report = 0;
        self.busy_at_report = self.busy_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_server_queues_then_refuses_and_counts_its_busy_time() {
        let mut s = Server::new(2, 1e6, 1);
        assert_eq!(s.arrive(0, 1), Admit::Started);
        assert_eq!(s.arrive(0, 2), Admit::Started);
        assert_eq!(s.arrive(0, 3), Admit::Queued);
        assert_eq!(s.arrive(0, 4), Admit::Refused);
        assert_eq!(s.active(), 3);
        // The first completes after 1 ms: the waiting one takes its worker.
        assert_eq!(s.complete(1_000_000, 0), Some(3));
        assert_eq!(s.complete(2_000_000, 0), None);
        assert_eq!(s.complete(2_000_000, 0), None);
        assert_eq!(s.busy, 0);
        // Two workers busy for 2 ms, then one for none: 4 worker-ms.
        s.report(2_000_000);
        assert_eq!(s.busy_ns, 4e6);
        assert_eq!((s.served, s.refused), (3, 1));
        assert!(s.rps > 0.0 && s.cpu > 0.0);
        assert_eq!(s.capacity(), 2000.0);
    }
}
