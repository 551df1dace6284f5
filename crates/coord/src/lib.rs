//! flowgate's coordination store: what the controllers of a cluster share.
//!
//! A [`Store`] offers the few primitives a hierarchy of controllers needs, with etcd v3's
//! meaning (docs/distributed.md):
//!
//! - **leases**: a key written under a lease disappears when its writer stops renewing it
//!   (a controller died or lost the store), so every piece of liveness-bound state —
//!   election keys, domain summaries — cleans itself up;
//! - **elections**: candidates queue by the revision at which their key was created; the
//!   lowest live one leads. That `create_revision` comes from the store's single revision
//!   counter, so it strictly increases from one leadership to the next: it is the
//!   **generation id** sent to switches in `ROLE_REQUEST(MASTER)` (OpenFlow 1.3 §6.3.6);
//! - **fenced writes**: a put that happens only while the writer's leader key still exists
//!   with the same `create_revision` — a deposed leader's writes fail at the store, as its
//!   FLOW_MODs fail at the switch.
//!
//! Two implementations: [`MemStore`] (in process; tests and single-process use) and, with
//! the `etcd` feature, [`etcd::EtcdStore`]. Nothing here sits on a PACKET_IN path: the
//! runtime calls the store from its own tasks only.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod process;
pub mod spill;

/// A boxed future, so that [`Store`] can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A store revision (etcd's global, strictly increasing modification counter).
pub type Revision = i64;

/// A lease, as granted by the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// A key with its value and the revisions that matter for fencing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub lease: Option<LeaseId>,
}

impl Kv {
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(&self.value).into_owned()
    }
}

/// Proof of having won an election: the leader key and the revision that created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub election: String,
    /// The leader key (`<election>/<lease in hex>`); leadership lasts as long as it exists
    /// with [`Leadership::revision`] as its create revision.
    pub key: String,
    pub revision: Revision,
    pub lease: LeaseId,
}

impl Leadership {
    /// The OpenFlow generation id of this leadership (§6.3.6): the election key's create
    /// revision, positive and strictly increasing across leaderships.
    pub fn generation_id(&self) -> u64 {
        self.revision.max(0) as u64
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    /// The store did not answer (down, partitioned, no quorum, timed out).
    #[error("coordination store unavailable: {0}")]
    Unavailable(String),
    /// The lease is gone: it expired (not renewed in time) or was revoked.
    #[error("lease {0:x} expired or revoked")]
    LeaseExpired(i64),
    /// Anything else the store refused.
    #[error("coordination store error: {0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, CoordError>;

/// The coordination primitives (etcd v3 semantics). Every method is one round trip (or,
/// for [`Store::campaign`], a wait); callers apply their own deadlines where they need
/// them.
pub trait Store: Send + Sync + 'static {
    /// A new lease of `ttl` (rounded up to whole seconds, as etcd grants them).
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId>>;
    /// Renew a lease once. [`CoordError::LeaseExpired`] when it is already gone.
    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>>;
    /// End a lease now: its keys (and any leadership held with it) go at once.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>>;
    fn put(
        &self,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<Revision>>;
    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<Kv>>>;
    /// Every key under `prefix`, in key order.
    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<Kv>>>;
    fn delete(&self, key: String) -> BoxFuture<'_, Result<()>>;
    /// Join `election` with `value` under `lease` and wait until this candidate leads.
    fn campaign(
        &self,
        election: String,
        value: Vec<u8>,
        lease: LeaseId,
    ) -> BoxFuture<'_, Result<Leadership>>;
    /// The current leader's key, if any.
    fn leader(&self, election: String) -> BoxFuture<'_, Result<Option<Kv>>>;
    /// Put `key` only while `leadership` holds. `Ok(false)`: the writer is no longer the
    /// leader (fenced).
    fn fenced_put(
        &self,
        leadership: Leadership,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<bool>>;
    /// Give up a leadership (the next candidate leads at once).
    fn resign(&self, leadership: Leadership) -> BoxFuture<'_, Result<()>>;
}

/// Store keys, in one place (docs/distributed.md has the layout and who writes what).
pub mod keys {
    /// The root of one cluster's keys.
    pub fn root(cluster: &str) -> String {
        format!("/flowgate/{cluster}")
    }
    /// Election of the global controllers (one active, the others standby).
    pub fn global_election(cluster: &str) -> String {
        format!("{}/global/leader", root(cluster))
    }
    /// Election of one domain's controller instances (the master, the standbys).
    pub fn domain_election(cluster: &str, domain: &str) -> String {
        format!("{}/domain/{domain}/leader", root(cluster))
    }
    /// Every live instance of a domain, under its lease (for the API's standby list).
    pub fn domain_member(cluster: &str, domain: &str, instance: &str) -> String {
        format!("{}/domain/{domain}/members/{instance}", root(cluster))
    }
    pub fn domain_members(cluster: &str, domain: &str) -> String {
        format!("{}/domain/{domain}/members/", root(cluster))
    }
    /// A domain's aggregated state (per service: load, capacity, health), written by its
    /// master under its lease, fenced by its leadership.
    pub fn domain_summary(cluster: &str, domain: &str) -> String {
        format!("{}/domain/{domain}/summary", root(cluster))
    }
    pub fn domains(cluster: &str) -> String {
        format!("{}/domain/", root(cluster))
    }
    /// Where a domain spills, written by the active global controller, fenced.
    pub fn spill(cluster: &str, domain: &str) -> String {
        format!("{}/spill/{domain}", root(cluster))
    }
    pub fn spills(cluster: &str) -> String {
        format!("{}/spill/", root(cluster))
    }
    /// Global controller instances alive (for the API).
    pub fn global_member(cluster: &str, instance: &str) -> String {
        format!("{}/global/members/{instance}", root(cluster))
    }
    pub fn global_members(cluster: &str) -> String {
        format!("{}/global/members/", root(cluster))
    }
    /// Service definitions shared by every domain (an operator changes a pool once).
    pub fn services(cluster: &str) -> String {
        format!("{}/services", root(cluster))
    }
}

/// Whole seconds, at least one: etcd grants leases in seconds.
pub fn ttl_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

// ----- in memory ----------------------------------------------------------------------

/// An in-process [`Store`] with etcd's semantics for the parts flowgate uses. Clones share
/// one store. [`MemStore::set_available`] simulates losing the store.
#[derive(Clone, Default)]
pub struct MemStore {
    inner: Arc<MemInner>,
}

#[derive(Default)]
struct MemInner {
    state: Mutex<MemState>,
    changed: tokio::sync::Notify,
    unavailable: AtomicBool,
}

#[derive(Default)]
struct MemState {
    revision: Revision,
    next_lease: i64,
    kvs: BTreeMap<String, Kv>,
    leases: HashMap<i64, (Duration, Instant)>,
}

impl MemState {
    fn expire(&mut self, now: Instant) -> bool {
        let dead: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            self.drop_lease(*id);
        }
        !dead.is_empty()
    }

    fn drop_lease(&mut self, id: i64) {
        self.leases.remove(&id);
        let before = self.kvs.len();
        self.kvs.retain(|_, kv| kv.lease != Some(LeaseId(id)));
        if self.kvs.len() != before {
            self.revision += 1;
        }
    }

    fn put(&mut self, key: String, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        if let Some(l) = lease
            && !self.leases.contains_key(&l.0)
        {
            return Err(CoordError::LeaseExpired(l.0));
        }
        self.revision += 1;
        let rev = self.revision;
        let create = self
            .kvs
            .get(&key)
            .map(|kv| kv.create_revision)
            .unwrap_or(rev);
        self.kvs.insert(
            key.clone(),
            Kv {
                key,
                value,
                create_revision: create,
                mod_revision: rev,
                lease,
            },
        );
        Ok(rev)
    }

    fn leader(&self, election: &str) -> Option<Kv> {
        let prefix = format!("{election}/");
        self.kvs
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, kv)| kv)
            .min_by_key(|kv| kv.create_revision)
            .cloned()
    }
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Make every call fail with [`CoordError::Unavailable`] (or work again). Leases keep
    /// counting down meanwhile, as they would on a store the client cannot reach.
    pub fn set_available(&self, available: bool) {
        self.inner.unavailable.store(!available, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }

    fn lock(&self) -> Result<MutexGuard<'_, MemState>> {
        if self.inner.unavailable.load(Ordering::SeqCst) {
            return Err(CoordError::Unavailable(
                "in-memory store set unavailable".into(),
            ));
        }
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.expire(Instant::now()) {
            self.inner.changed.notify_waiters();
        }
        Ok(st)
    }

    fn done<T>(&self, r: T) -> T {
        self.inner.changed.notify_waiters();
        r
    }
}

impl Store for MemStore {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            st.next_lease += 1;
            let id = 0x7a00_0000 + st.next_lease;
            let ttl = Duration::from_secs(ttl_secs(ttl) as u64);
            st.leases.insert(id, (ttl, Instant::now() + ttl));
            Ok(LeaseId(id))
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            match st.leases.get_mut(&lease.0) {
                Some((ttl, deadline)) => {
                    *deadline = Instant::now() + *ttl;
                    Ok(())
                }
                None => Err(CoordError::LeaseExpired(lease.0)),
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            st.drop_lease(lease.0);
            drop(st);
            self.done(());
            Ok(())
        })
    }

    fn put(
        &self,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<Revision>> {
        Box::pin(async move {
            let r = self.lock()?.put(key, value, lease);
            self.done(r)
        })
    }

    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<Kv>>> {
        Box::pin(async move { Ok(self.lock()?.kvs.get(&key).cloned()) })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<Kv>>> {
        Box::pin(async move {
            let st = self.lock()?;
            Ok(st
                .kvs
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(_, v)| v.clone())
                .collect())
        })
    }

    fn delete(&self, key: String) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            if st.kvs.remove(&key).is_some() {
                st.revision += 1;
            }
            drop(st);
            self.done(());
            Ok(())
        })
    }

    fn campaign(
        &self,
        election: String,
        value: Vec<u8>,
        lease: LeaseId,
    ) -> BoxFuture<'_, Result<Leadership>> {
        Box::pin(async move {
            let key = format!("{election}/{:x}", lease.0);
            {
                let mut st = self.lock()?;
                if !st.kvs.contains_key(&key) {
                    st.put(key.clone(), value, Some(lease))?;
                }
            }
            self.inner.changed.notify_waiters();
            loop {
                let notified = self.inner.changed.notified();
                {
                    let st = self.lock()?;
                    let Some(mine) = st.kvs.get(&key) else {
                        return Err(CoordError::LeaseExpired(lease.0));
                    };
                    if st.leader(&election).is_some_and(|l| l.key == key) {
                        return Ok(Leadership {
                            election,
                            key,
                            revision: mine.create_revision,
                            lease,
                        });
                    }
                }
                // Leases expire by the clock, not by an event: look again now and then.
                let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
            }
        })
    }

    fn leader(&self, election: String) -> BoxFuture<'_, Result<Option<Kv>>> {
        Box::pin(async move { Ok(self.lock()?.leader(&election)) })
    }

    fn fenced_put(
        &self,
        leadership: Leadership,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            let holds = st
                .kvs
                .get(&leadership.key)
                .is_some_and(|kv| kv.create_revision == leadership.revision);
            if !holds {
                return Ok(false);
            }
            st.put(key, value, lease)?;
            drop(st);
            Ok(self.done(true))
        })
    }

    fn resign(&self, leadership: Leadership) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut st = self.lock()?;
            if st
                .kvs
                .get(&leadership.key)
                .is_some_and(|kv| kv.create_revision == leadership.revision)
            {
                st.kvs.remove(&leadership.key);
                st.revision += 1;
            }
            drop(st);
            self.done(());
            Ok(())
        })
    }
}

/// Conformance checks every [`Store`] must pass; run against [`MemStore`] here and against
/// a real etcd by flowgate's integration tests.
pub mod conformance {
    use super::*;

    /// Put/get/list, leases (expiry takes the keys), an election with two candidates, the
    /// fenced write of the leader, failover when the leader's lease lapses, and the deposed
    /// leader's fenced write refused. `prefix` keeps runs apart.
    pub async fn run(store: &dyn Store, prefix: &str) -> std::result::Result<(), String> {
        let e = |what: &str, err: CoordError| format!("{what}: {err}");
        let k = |s: &str| format!("{prefix}/{s}");
        store
            .put(k("a"), b"1".to_vec(), None)
            .await
            .map_err(|x| e("put", x))?;
        let got = store.get(k("a")).await.map_err(|x| e("get", x))?;
        if got.as_ref().map(|kv| kv.value.as_slice()) != Some(b"1") {
            return Err(format!("get returned {got:?}"));
        }
        store
            .put(k("b"), b"2".to_vec(), None)
            .await
            .map_err(|x| e("put", x))?;
        let listed = store
            .list(format!("{prefix}/"))
            .await
            .map_err(|x| e("list", x))?;
        if listed.len() != 2 {
            return Err(format!("list returned {listed:?}"));
        }
        store.delete(k("b")).await.map_err(|x| e("delete", x))?;

        // Election: A leads, B waits; A's fenced write works.
        let election = k("election");
        let la = store
            .grant(Duration::from_secs(2))
            .await
            .map_err(|x| e("grant", x))?;
        let lb = store
            .grant(Duration::from_secs(2))
            .await
            .map_err(|x| e("grant", x))?;
        store
            .put(k("leased"), b"x".to_vec(), Some(la))
            .await
            .map_err(|x| e("leased put", x))?;
        let a = store
            .campaign(election.clone(), b"A".to_vec(), la)
            .await
            .map_err(|x| e("campaign A", x))?;
        let leader = store
            .leader(election.clone())
            .await
            .map_err(|x| e("leader", x))?;
        if leader.as_ref().map(|kv| kv.value.as_slice()) != Some(b"A") {
            return Err(format!("leader is {leader:?}, not A"));
        }
        if !store
            .fenced_put(a.clone(), k("decision"), b"by-A".to_vec(), None)
            .await
            .map_err(|x| e("fenced put", x))?
        {
            return Err("the leader's fenced write was refused".into());
        }
        // B campaigns while keeping its lease alive; A stops renewing (it "crashed").
        let b_wins = async {
            let started = Instant::now();
            let campaign = store.campaign(election.clone(), b"B".to_vec(), lb);
            tokio::pin!(campaign);
            loop {
                tokio::select! {
                    r = &mut campaign => return r.map(|l| (l, started.elapsed())),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        store.keep_alive(lb).await?;
                    }
                }
            }
        };
        let (b, took) = tokio::time::timeout(Duration::from_secs(10), b_wins)
            .await
            .map_err(|_| "B never won after A's lease lapsed".to_string())?
            .map_err(|x| e("campaign B", x))?;
        if took > Duration::from_secs(5) {
            return Err(format!("B took {took:?} to win"));
        }
        if b.revision <= a.revision {
            return Err(format!(
                "generation did not increase: {} then {}",
                a.revision, b.revision
            ));
        }
        if store
            .get(k("leased"))
            .await
            .map_err(|x| e("get", x))?
            .is_some()
        {
            return Err("a key under the expired lease survived".into());
        }
        if store
            .fenced_put(a, k("decision"), b"by-stale-A".to_vec(), None)
            .await
            .map_err(|x| e("stale fenced put", x))?
        {
            return Err("the deposed leader's fenced write succeeded".into());
        }
        let d = store.get(k("decision")).await.map_err(|x| e("get", x))?;
        if d.map(|kv| kv.value) != Some(b"by-A".to_vec()) {
            return Err("the decision changed".into());
        }
        store.resign(b).await.map_err(|x| e("resign", x))?;
        if store
            .leader(election)
            .await
            .map_err(|x| e("leader", x))?
            .is_some()
        {
            return Err("a leader remains after resign".into());
        }
        store.revoke(lb).await.map_err(|x| e("revoke", x))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mem_store_conformance() {
        let s = MemStore::new();
        conformance::run(&s, "/t")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test]
    async fn unavailable_store_fails_fast_and_recovers() {
        let s = MemStore::new();
        s.put("/k".into(), b"v".to_vec(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.set_available(false);
        assert!(matches!(
            s.get("/k".into()).await,
            Err(CoordError::Unavailable(_))
        ));
        s.set_available(true);
        assert!(
            s.get("/k".into())
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .is_some()
        );
    }

    #[test]
    fn ttl_rounds_up_to_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(0)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(3)), 3);
    }
}
