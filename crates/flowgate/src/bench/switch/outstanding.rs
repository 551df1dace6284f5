//! The outstanding probes of a VIP run (a ring by probe number) and what each has had
//! of its answer so far.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Instant;

/// The outstanding probes of a VIP run, by number: a ring from the oldest one on, where
/// a probe answered or lost leaves a hole until those before it are gone. A probe is
/// looked up by its client address and port, which name its number
/// ([`SwitchPlan::client_of`](super::SwitchPlan::client_of) backwards): no hashing, and
/// neighbours in memory (a hash map here was 15 % of the bench thread's time).
pub(super) struct Outstanding {
    client_base: [u8; 2],
    /// Probe number of `slots[0]`.
    pub(super) base: u64,
    slots: VecDeque<Option<Pending>>,
    len: usize,
}

impl Outstanding {
    pub(super) fn new(client_base: [u8; 2]) -> Outstanding {
        Outstanding {
            client_base,
            base: 0,
            slots: VecDeque::new(),
            len: 0,
        }
    }

    /// The number of the probe from `client`, if some probe is from it (numbers below
    /// 2^16 × 60,000, where `client_of` starts over: hours of probes at any rate here).
    pub(super) fn probe_of(&self, client: &(Ipv4Addr, u16)) -> Option<u64> {
        let [a, b, h, l] = client.0.octets();
        let i = client.1.checked_sub(1024).filter(|i| *i < 60_000)?;
        ([a, b] == self.client_base)
            .then(|| u64::from(u16::from_be_bytes([h, l])) * 60_000 + u64::from(i))
    }

    fn slot(&self, client: &(Ipv4Addr, u16)) -> Option<usize> {
        let k = self.probe_of(client)?;
        usize::try_from(k.checked_sub(self.base)?).ok()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Probe `k` was sent (probes are sent in order).
    pub(super) fn insert(&mut self, k: u64, p: Pending) {
        if self.slots.is_empty() {
            self.base = k;
        }
        while self.base + (self.slots.len() as u64) < k {
            self.slots.push_back(None);
        }
        self.slots.push_back(Some(p));
        self.len += 1;
    }

    pub(super) fn get(&self, client: &(Ipv4Addr, u16)) -> Option<&Pending> {
        self.slots.get(self.slot(client)?)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, client: &(Ipv4Addr, u16)) -> Option<&mut Pending> {
        let i = self.slot(client)?;
        self.slots.get_mut(i)?.as_mut()
    }

    pub(super) fn contains_key(&self, client: &(Ipv4Addr, u16)) -> bool {
        self.get(client).is_some()
    }

    pub(super) fn remove(&mut self, client: &(Ipv4Addr, u16)) -> Option<Pending> {
        let i = self.slot(client)?;
        let p = self.slots.get_mut(i)?.take()?;
        self.len -= 1;
        self.drop_holes();
        Some(p)
    }

    /// Probes `from..to` (by number) went out whole at `t`: their latency counts from
    /// then. Those answered already are gone and keep theirs.
    pub(super) fn sent_at(&mut self, from: u64, to: u64, t: Instant) {
        for k in from.max(self.base)..to {
            let Ok(i) = usize::try_from(k - self.base) else {
                return;
            };
            match self.slots.get_mut(i) {
                Some(Some(p)) => p.sent = t,
                Some(None) => {}
                None => return,
            }
        }
    }

    /// Remove the oldest probes while `expired` says so (probes are sent in order, so the
    /// expired ones come first).
    pub(super) fn expire(&mut self, expired: impl Fn(&Pending) -> bool) {
        while let Some(Some(p)) = self.slots.front() {
            if !expired(p) {
                break;
            }
            self.slots.pop_front();
            self.base += 1;
            self.len -= 1;
            self.drop_holes();
        }
    }

    fn drop_holes(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) sent: Instant,
    /// When the open-loop schedule had it fall due (`sent` otherwise): a latency counted
    /// from here includes the bench's own delay in sending it.
    pub(super) due: Instant,
    pub(super) fwd: Option<usize>,
    pub(super) rev: bool,
    pub(super) out: Option<usize>,
    /// The controller sent the SYN on without rules (`controller::handshake`): the
    /// probe completes with the rules and the PACKET_OUT of the client's ACK.
    pub(super) deferred: bool,
    /// The client's SYN's sequence number.
    pub(super) isn: u32,
    /// The FLOW_REMOVEDs of the rules that asked for OFPFF_SEND_FLOW_REM, to send when
    /// they "idle out".
    pub(super) removals: super::probe::Removals,
}

/// What a part of an answer made of its probe.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Consistent so far, not complete.
    Open,
    /// All three parts arrived and agree.
    Complete,
    /// A wrong answer, and why.
    Invalid(String),
}

impl Pending {
    /// After recording one part naming `backend`: do the parts agree, are they all here?
    pub(super) fn verdict(&self, key: (Ipv4Addr, u16), backend: Option<usize>) -> Verdict {
        let (fwd, out) = (self.fwd, self.out);
        let agree = |x: Option<usize>| x.is_none() || x == fwd.or(out);
        if !agree(backend) || (fwd.is_some() && out.is_some() && fwd != out) {
            return Verdict::Invalid(format!(
                "{key:?}: the rules and the PACKET_OUT name different backends"
            ));
        }
        if fwd.is_some() && self.rev && out.is_some() {
            Verdict::Complete
        } else {
            Verdict::Open
        }
    }
}
