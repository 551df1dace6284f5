//! ISSLM, the seed paper's server-load-management algorithm (Table 2):
//!
//! ```text
//! if (Request load of requested server >= Server load) {
//!     Remove the requested server from the available servers list;
//!     For five times:
//!         if (Server search with lesser request load value = Successful) { move; break }
//!         else if (Server search with the fewest connections active = Successful) { move; break }
//!         else if (Server search with slowest [sic: fastest] response time = Successful) { move; break }
//!         else Print "The optimal server was not found";
//! } else { The requested server is given a new HTTP flow; }
//! ```
//!
//! Our reading, where the pseudo-code leaves gaps:
//!
//! * *Request load* is [`effective_rps`](super::effective_rps) (measured RPS blended
//!   with the connections this balancer assigned since the refresh, so a burst cannot
//!   pile onto one target).
//!   *Server load* `S_Load` is [`AlgorithmParams::threshold_rps`].
//! * *Hysteresis* (anchors §1.6): a backend becomes over at `load ≥ T` and stays over until
//!   `load < T·(1 − hysteresis)`. The latch is per backend, updated on every refresh and
//!   whenever select examines the backend. Without it a backend hovering at `T` flaps.
//! * The *available servers list* is the usable backends (eligible, weight > 0). An
//!   unusable requested server is treated as over (it must be moved from).
//! * *Five tries*: the searches read the same data on each try, so a literal repeat
//!   changes nothing. A try only matters if the search goes further: each of the three
//!   searches keeps its own ranking (lowest effective RPS; fewest active + picked
//!   connections; lowest measured RT, unmeasured backends not ranked) and on try k
//!   proposes its best candidate not yet rejected. A search is *successful* when its
//!   proposal has fresh, valid metrics and is not over. So the first try is the
//!   pseudo-code's if/else-if chain on the three best candidates; later tries look one
//!   rank deeper in each ranking. At most `3 × isslm_tries` proposals are examined
//!   (the implementation gets the same answer in two O(n) passes). Equal keys rank in
//!   round-robin order from the cursor.
//! * *Not found*: outcome `NoOptimalServer`. The paper only prints a message; we keep the
//!   flow on the requested server when it is usable (the flow is not dropped), else
//!   `backend: None`.
//! * *Stale metrics*: a stale backend still takes flows addressed to it (its last load
//!   decides whether it is over; in a reactive service, where the controller counts
//!   every connection, that is the controller's own rate once the report is stale), but
//!   it is never a move target: "lesser request load" cannot be vouched for on old data.
//! * *Slow start*: a backend ramping at fraction `f` shows its request load, connections
//!   and response time divided by `f` (so it is over at `f·S_Load`); see the module docs
//!   of [`balance`](super).

use std::cmp::Ordering;
use std::time::Duration;

use super::{
    AlgorithmParams, BackendLoad, Balancer, Outcome, RateCtx, Search, SelectRequest, Selection,
    conns, key_f, usable, valid,
};

/// `(key, rotated position)` ordering of a ranking.
#[inline]
fn rank_less(a: (f64, usize), b: (f64, usize)) -> bool {
    match a.0.total_cmp(&b.0) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => a.1 < b.1,
    }
}

/// The threshold, or +∞ ("never over") when unset or invalid.
fn threshold(p: &AlgorithmParams) -> f64 {
    p.threshold_rps
        .filter(|t| t.is_finite() && *t > 0.0)
        .unwrap_or(f64::INFINITY)
}

impl Balancer {
    /// Updates and returns the over latch of backend `i` for effective load `load`.
    fn latch(&mut self, i: usize, load: f64, t: f64) -> bool {
        let Some(was) = self.over.get(i).copied() else {
            return false;
        };
        if !t.is_finite() {
            self.over[i] = false;
            return false;
        }
        let h = self.params.hysteresis;
        let h = if h.is_finite() {
            h.clamp(0.0, 0.99)
        } else {
            0.0
        };
        let load = if load.is_nan() { 0.0 } else { load };
        let now = if was {
            load >= t * (1.0 - h)
        } else {
            load >= t
        };
        self.over[i] = now;
        now
    }

    pub(super) fn refresh_isslm(&mut self, b: &[BackendLoad]) {
        let t = threshold(&self.params);
        let rc = RateCtx::new(Duration::ZERO, self.rate_window());
        for (i, x) in b.iter().enumerate() {
            let f = self.ramp(i);
            self.latch(i, rc.eff(x) / f, t);
        }
    }

    pub(super) fn select_isslm(&mut self, req: &SelectRequest, b: &[BackendLoad]) -> Selection {
        let n = b.len();
        let t = threshold(&self.params);
        let rc = RateCtx::new(req.since_refresh, self.rate_window());
        let (requested, from_client) = match req.requested.filter(|&r| r < n) {
            Some(r) => (r, true),
            // Behind a VIP the "requested" server is the base policy's: smooth weighted
            // round robin, so that weights hold under ISSLM too. A domain controller's
            // spill is nothing but weights (a tenth of the flows to the remote backends):
            // a plain rotation gave each remote backend an equal turn with the local
            // ones, a third of the flows each in the lab's Case C.
            None => match self.select_wrr(b) {
                Some(r) => (r, false),
                None => return Selection::NONE_ELIGIBLE,
            },
        };
        let req_usable = usable(&b[requested]);
        let f = self.ramp(requested);
        let over = self.latch(requested, rc.eff(&b[requested]) / f, t);
        if req_usable && !over {
            return Selection {
                backend: Some(requested),
                outcome: Outcome::Requested,
            };
        }
        match self.isslm_search(b, requested, t, rc) {
            Some((i, search)) => {
                if from_client {
                    // Rotate ties of later searches (behind a VIP the base RR does it).
                    self.cursor = i + 1;
                }
                Selection {
                    backend: Some(i),
                    outcome: Outcome::Moved {
                        from: requested,
                        search: Some(search),
                    },
                }
            }
            None if req_usable => Selection {
                backend: Some(requested),
                outcome: Outcome::NoOptimalServer,
            },
            None if b.iter().any(usable) => Selection {
                backend: None,
                outcome: Outcome::NoOptimalServer,
            },
            None => Selection::NONE_ELIGIBLE,
        }
    }

    /// The bounded three-ranking search; see the module docs.
    ///
    /// Equivalent to walking the rankings try by try, in O(n) whatever `isslm_tries`:
    /// a proposal's acceptance does not depend on when it is examined, so the walk
    /// stops at the smallest `(rank of the best acceptable candidate, search)` pair,
    /// provided that rank is below `isslm_tries`. Pass 1 takes each candidate's keys and
    /// acceptance (into the scratch buffer) and each ranking's best acceptable and best
    /// overall candidate; pass 2, needed only when the RPS ranking's leader is rejected,
    /// counts the ranks. No allocation.
    fn isslm_search(
        &mut self,
        b: &[BackendLoad],
        requested: usize,
        t: f64,
        rc: RateCtx,
    ) -> Option<(usize, Search)> {
        let n = b.len();
        let s = self.start(n);
        // (key, rotated position, index) of the best acceptable / best overall candidate.
        let mut best_ok: [Option<(f64, usize, usize)>; 3] = [None; 3];
        let mut best_any: [Option<(f64, usize)>; 3] = [None; 3];
        for (i, x) in b.iter().enumerate() {
            if i == requested || !usable(x) {
                self.scratch[i][3] = f64::NAN; // not a candidate
                continue;
            }
            let pos = (i + n - s) % n;
            let f = self.ramp(i);
            let eff = rc.eff(x) / f;
            let keys = [
                key_f(eff),
                conns(x) / f,
                valid(x.response_time_ms).map_or(f64::NAN, |r| r / f), // unmeasured: not ranked
            ];
            let ok = x.metrics_fresh && !x.rps.is_nan() && x.rps >= 0.0 && !self.latch(i, eff, t);
            self.scratch[i] = [keys[0], keys[1], keys[2], if ok { 1.0 } else { 0.0 }];
            for k in 0..3 {
                if keys[k].is_nan() {
                    continue;
                }
                if best_any[k].is_none_or(|a| rank_less((keys[k], pos), a)) {
                    best_any[k] = Some((keys[k], pos));
                }
                if ok && best_ok[k].is_none_or(|(bk, bp, _)| rank_less((keys[k], pos), (bk, bp))) {
                    best_ok[k] = Some((keys[k], pos, i));
                }
            }
        }
        // Try 1, search 1 succeeds: the RPS leader is acceptable.
        if let (Some((k, p, i)), Some(a)) = (best_ok[0], best_any[0])
            && (k, p) == a
        {
            return Some((i, Search::RequestLoad));
        }
        let mut rank = [0usize; 3];
        for (i, sc) in self.scratch[..n].iter().enumerate() {
            if sc[3].is_nan() {
                continue;
            }
            let pos = (i + n - s) % n;
            for k in 0..3 {
                if let Some((bk, bp, _)) = best_ok[k]
                    && !sc[k].is_nan()
                    && rank_less((sc[k], pos), (bk, bp))
                {
                    rank[k] += 1;
                }
            }
        }
        let tries = usize::try_from(self.params.isslm_tries.max(1)).unwrap_or(usize::MAX);
        // The smallest (try, search) pair: on one try the searches go in Table 2's order.
        let mut winner: Option<(usize, usize, Search)> = None;
        for (k, search) in Search::ALL.into_iter().enumerate() {
            if let Some((_, _, i)) = best_ok[k]
                && rank[k] < tries
                && winner.is_none_or(|(r, _, _)| rank[k] < r)
            {
                winner = Some((rank[k], i, search));
            }
        }
        winner.map(|(_, i, search)| (i, search))
    }
}
