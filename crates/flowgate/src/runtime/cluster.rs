//! The cluster layer: domain controllers and global controllers coordinated through a
//! [`flowgate_coord::Store`] (etcd). docs/distributed.md has the design.
//!
//! - **Domain instance** (`[cluster] role = "domain"`): campaigns in its domain's election.
//!   The winner sends `ROLE_REQUEST(MASTER)` to every switch of the domain with the
//!   election key's create revision as `generation_id` (OpenFlow 1.3 §6.3.6); the others
//!   send `ROLE_REQUEST(SLAVE)` and keep their sessions (port status, flow stats: a warm
//!   view). A session is writable only once its switch confirmed MASTER, and stops being
//!   writable on any sign of demotion (role-status, `IS_SLAVE`, `STALE`): the core never
//!   installs from a SLAVE or EQUAL session. The EQUAL role is never requested.
//! - **Global instance** (`role = "global"`): one active, the others standby, through the
//!   global election. The active one reads the domains' summaries and writes, fenced by
//!   its leadership, where each overloaded domain spills and with what weights.
//!
//! - **Shared services**: domain instances apply the `[[service]]` tables an operator puts
//!   in the store (one change, every domain), and apply their domain's spill decision as
//!   weights (other domains' backends behind the `uplink`).
//!
//! The store is only called from these tasks: nothing here sits on the PACKET_IN path. If
//! the store is unreachable, a master keeps serving with its last state (the switch, not
//! the store, fences it if another instance takes over) and says so in logs, the API
//! (`/api/v1/cluster`) and metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flowgate_coord::spill::{DomainSummary, SpillDecision, SpillParams, SpillPolicy};
use flowgate_coord::{CoordError, Kv, Leadership, LeaseId, Store, keys};
use flowgate_core::config::{ClusterConfig, ClusterRole};
use flowgate_core::topology::Dpid;
use ofp::{ControllerRole, Message, MsgType, RoleMsg};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Handle;

/// ONF extension 0x4f4e4600, type 1911: role status, OVS's backport of OpenFlow 1.4's
/// OFPT_ROLE_STATUS to 1.3 (sent to a master that another controller demoted).
const ONF_EXPERIMENTER: u32 = 0x4f4e_4600;
const ONF_ROLE_STATUS: u32 = 1911;

/// Messages a SLAVE may not send (§6.3.6: the switch answers them with
/// `BAD_REQUEST/IS_SLAVE`). Reads (multipart, barrier, echo, role) stay allowed.
pub(crate) fn is_write(msg: &Message) -> bool {
    is_write_type(msg.msg_type())
}

/// [`is_write`] by the message's type alone (for messages already encoded).
pub(crate) fn is_write_type(t: MsgType) -> bool {
    matches!(
        t,
        MsgType::FlowMod
            | MsgType::GroupMod
            | MsgType::PortMod
            | MsgType::TableMod
            | MsgType::MeterMod
            | MsgType::PacketOut
            | MsgType::SetConfig
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What this instance is, right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mastership {
    /// Single-controller mode: no roles at all.
    Single,
    /// Not (yet) elected: SLAVE on every switch (a global instance: standby).
    Standby,
    /// Elected: MASTER on every switch (a global instance: active).
    Master,
}

/// One switch's role as the switch last confirmed it.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchRole {
    /// "master", "slave", or "pending" (asked, not yet confirmed; never writable).
    pub role: &'static str,
    pub generation_id: u64,
    /// When the switch confirmed the current role (Unix ms).
    pub since_unix_ms: u64,
    /// Why the switch last refused or demoted us, if it did.
    pub last_refusal: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct View {
    mastership: Mastership,
    /// Our leadership's generation when leading; else the highest leader generation seen.
    generation_id: u64,
    /// The current leader of our election, as the store last said.
    leader: Option<String>,
    /// When this instance last became master/active (Unix ms).
    leader_since_unix_ms: Option<u64>,
    store_reachable: bool,
    store_error: Option<String>,
    store_unreachable_since_unix_ms: Option<u64>,
    switches: BTreeMap<String, SwitchRole>,
    /// The spill decision the global controller last wrote for this domain.
    spill: Value,
    /// Since when this domain sends new connections to other domains (Unix ms).
    spill_applied_unix_ms: Option<u64>,
    /// The cluster as the store last showed it (domains, masters, standbys, global).
    cluster: Value,
}

/// Counters exported as metrics.
#[derive(Debug, Default)]
pub struct ClusterCounters {
    pub elections_won: AtomicU64,
    pub demotions: AtomicU64,
    pub store_errors: AtomicU64,
    pub fenced_writes_refused: AtomicU64,
    pub switch_refusals: AtomicU64,
}

/// This instance's place in the cluster, shared by the sessions, the cluster task and the
/// API.
pub struct ClusterState {
    pub cfg: ClusterConfig,
    view: Mutex<View>,
    /// Per switch: writable (confirmed MASTER) or not, read on the PACKET_IN path.
    roles: Mutex<HashMap<Dpid, bool>>,
    pub counters: ClusterCounters,
}

impl ClusterState {
    pub fn new(cfg: &ClusterConfig) -> ClusterState {
        ClusterState {
            cfg: cfg.clone(),
            view: Mutex::new(View {
                mastership: if cfg.role == ClusterRole::Single {
                    Mastership::Single
                } else {
                    Mastership::Standby
                },
                generation_id: 0,
                leader: None,
                leader_since_unix_ms: None,
                store_reachable: cfg.role == ClusterRole::Single,
                store_error: None,
                store_unreachable_since_unix_ms: None,
                switches: BTreeMap::new(),
                spill: Value::Null,
                spill_applied_unix_ms: None,
                cluster: Value::Null,
            }),
            roles: Mutex::new(HashMap::new()),
            counters: ClusterCounters::default(),
        }
    }

    fn is_single(&self) -> bool {
        self.cfg.role == ClusterRole::Single
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn roles(&self) -> MutexGuard<'_, HashMap<Dpid, bool>> {
        self.roles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The switch confirmed us as its MASTER.
    fn is_master_of(&self, dpid: Dpid) -> bool {
        self.roles().get(&dpid).copied().unwrap_or(false)
    }

    pub fn mastership(&self) -> Mastership {
        self.view().mastership
    }

    pub fn store_reachable(&self) -> bool {
        self.view().store_reachable
    }

    /// The ROLE_REQUEST a new session sends right after its handshake (none in single
    /// mode). Never EQUAL.
    pub fn role_request(&self) -> Option<Message> {
        if self.is_single() {
            return None;
        }
        let v = self.view();
        let role = match v.mastership {
            Mastership::Master => ControllerRole::Master,
            _ => ControllerRole::Slave,
        };
        Some(Message::RoleRequest(RoleMsg {
            role,
            generation_id: v.generation_id,
        }))
    }

    /// What a new session sends right after its handshake, in a cluster: SET_ASYNC so that
    /// a SLAVE still receives PACKET_IN, FLOW_REMOVED and PORT_STATUS (a warm standby:
    /// hosts, links and connections known before it takes over), then the role request.
    /// Empty in single mode.
    pub fn session_opening(&self) -> Vec<Message> {
        let Some(role) = self.role_request() else {
            return Vec::new();
        };
        let all = ofp::AsyncConfig {
            // OFPR_NO_MATCH | OFPR_ACTION | OFPR_INVALID_TTL (§7.4.1), for master and slave.
            packet_in_mask: [0b111, 0b111],
            // OFPPR_ADD | OFPPR_DELETE | OFPPR_MODIFY.
            port_status_mask: [0b111, 0b111],
            // OFPRR_IDLE_TIMEOUT | HARD_TIMEOUT | DELETE | GROUP_DELETE.
            flow_removed_mask: [0b1111, 0b1111],
        };
        vec![Message::SetAsync(all), role]
    }

    pub(crate) fn switch_gone(&self, dpid: Dpid) {
        if self.is_single() {
            return;
        }
        self.roles().remove(&dpid);
        self.view().switches.remove(&format!("{dpid:016x}"));
    }

    fn set_switch(
        &self,
        dpid: Dpid,
        role: &'static str,
        generation_id: u64,
        refusal: Option<String>,
    ) {
        self.roles().insert(dpid, role == "master");
        let mut v = self.view();
        let e = v
            .switches
            .entry(format!("{dpid:016x}"))
            .or_insert(SwitchRole {
                role,
                generation_id,
                since_unix_ms: unix_ms(),
                last_refusal: None,
            });
        if e.role != role {
            e.since_unix_ms = unix_ms();
        }
        e.role = role;
        e.generation_id = generation_id;
        if refusal.is_some() {
            e.last_refusal = refusal;
        }
    }

    fn store_ok(&self) {
        let mut v = self.view();
        if !v.store_reachable {
            tracing::info!("coordination store reachable");
        }
        v.store_reachable = true;
        v.store_error = None;
        v.store_unreachable_since_unix_ms = None;
    }

    fn store_failed(&self, e: &CoordError) {
        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
        let mut v = self.view();
        if v.store_reachable || v.store_unreachable_since_unix_ms.is_none() {
            tracing::warn!(error = %e, mastership = ?v.mastership, "coordination store unreachable: serving with the last known state");
            v.store_unreachable_since_unix_ms = Some(unix_ms());
        }
        v.store_reachable = false;
        v.store_error = Some(e.to_string());
    }

    /// Everything `/api/v1/cluster` shows.
    pub fn snapshot(&self) -> Value {
        let v = self.view().clone();
        let c = &self.counters;
        json!({
            "role": self.cfg.role,
            "name": self.cfg.name,
            "instance": self.cfg.instance,
            "domain": self.cfg.domain,
            "dpids": self.cfg.dpids.iter().map(|d| format!("{d:016x}")).collect::<Vec<_>>(),
            "mastership": v.mastership,
            "generation_id": v.generation_id,
            "leader": v.leader,
            "leader_since_unix_ms": v.leader_since_unix_ms,
            "store": {
                "reachable": v.store_reachable,
                "error": v.store_error,
                "unreachable_since_unix_ms": v.store_unreachable_since_unix_ms,
            },
            "switches": v.switches,
            "spill": v.spill,
            "spill_applied_unix_ms": v.spill_applied_unix_ms,
            "uplink": self.cfg.uplink.map(|(d, p)| format!("{d:016x}:{p}")),
            "cluster": v.cluster,
            "counters": {
                "elections_won": c.elections_won.load(Ordering::Relaxed),
                "demotions": c.demotions.load(Ordering::Relaxed),
                "store_errors": c.store_errors.load(Ordering::Relaxed),
                "fenced_writes_refused": c.fenced_writes_refused.load(Ordering::Relaxed),
                "switch_refusals": c.switch_refusals.load(Ordering::Relaxed),
            },
        })
    }

    /// Prometheus lines for `/metrics` (empty in single mode).
    pub fn metrics_text(&self) -> String {
        if self.is_single() {
            return String::new();
        }
        let v = self.view();
        let c = &self.counters;
        let masters = v.switches.values().filter(|s| s.role == "master").count();
        format!(
            "# TYPE flowgate_cluster_master gauge\nflowgate_cluster_master {}\n\
             # TYPE flowgate_cluster_store_reachable gauge\nflowgate_cluster_store_reachable {}\n\
             # TYPE flowgate_cluster_generation_id gauge\nflowgate_cluster_generation_id {}\n\
             # TYPE flowgate_cluster_switches_mastered gauge\nflowgate_cluster_switches_mastered {masters}\n\
             # TYPE flowgate_cluster_elections_won_total counter\nflowgate_cluster_elections_won_total {}\n\
             # TYPE flowgate_cluster_demotions_total counter\nflowgate_cluster_demotions_total {}\n\
             # TYPE flowgate_cluster_store_errors_total counter\nflowgate_cluster_store_errors_total {}\n\
             # TYPE flowgate_cluster_switch_refusals_total counter\nflowgate_cluster_switch_refusals_total {}\n",
            u8::from(v.mastership == Mastership::Master),
            u8::from(v.store_reachable),
            v.generation_id,
            c.elections_won.load(Ordering::Relaxed),
            c.demotions.load(Ordering::Relaxed),
            c.store_errors.load(Ordering::Relaxed),
            c.switch_refusals.load(Ordering::Relaxed),
        )
    }
}

/// A message from a switch that concerns roles. Returns true when it is consumed here
/// (the core does not see it).
pub(crate) fn on_switch_message(
    handle: &Handle,
    features: &ofp::SwitchFeatures,
    msg: &Message,
) -> bool {
    let cs = &handle.cluster;
    if cs.is_single() {
        return false;
    }
    let dpid = features.datapath_id;
    match msg {
        Message::RoleReply(r) => {
            match r.role {
                ControllerRole::Master => {
                    let newly = !cs.is_master_of(dpid);
                    cs.set_switch(dpid, "master", r.generation_id, None);
                    if newly {
                        tracing::info!(
                            dpid = format_args!("{dpid:016x}"),
                            generation_id = r.generation_id,
                            "switch confirmed us as MASTER: resyncing it"
                        );
                        let now = Instant::now();
                        let mut core = handle.lock();
                        if let Some(s) = core.sessions.get_mut(&dpid) {
                            s.writable = true;
                        }
                        // Resync as for a returning switch: proactive rules replaced,
                        // connection rules (and their connections) untouched.
                        core.with(|c, out| c.handle_switch_up(now, *features, out));
                    }
                }
                other => {
                    set_writable(handle, dpid, false);
                    let name = if other == ControllerRole::Slave {
                        "slave"
                    } else {
                        "pending"
                    };
                    if other == ControllerRole::Equal {
                        tracing::error!(
                            dpid = format_args!("{dpid:016x}"),
                            "switch reports the EQUAL role, which flowgate never requests"
                        );
                    }
                    cs.set_switch(dpid, name, r.generation_id, None);
                }
            }
            true
        }
        Message::Experimenter(e)
            if e.experimenter == ONF_EXPERIMENTER && e.exp_type == ONF_ROLE_STATUS =>
        {
            // ofp_role_status: role (u32), reason (u8), pad, generation_id (u64).
            let role = e
                .data
                .get(0..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .unwrap_or(0);
            let generation_id = e
                .data
                .get(8..16)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    u64::from_be_bytes(a)
                })
                .unwrap_or(0);
            if ControllerRole::from_raw(role) != ControllerRole::Master {
                demoted_by_switch(
                    handle,
                    dpid,
                    generation_id,
                    "role-status: another controller is MASTER",
                );
            }
            true
        }
        Message::Error(e) => match e.kind {
            ofp::ErrorKind::RoleRequestFailed(code) => {
                demoted_by_switch(
                    handle,
                    dpid,
                    0,
                    &format!(
                        "ROLE_REQUEST refused: {}",
                        code.name().unwrap_or("unknown code")
                    ),
                );
                true
            }
            ofp::ErrorKind::BadRequest(ofp::errmsg::BadRequestCode::IsSlave) => {
                demoted_by_switch(handle, dpid, 0, "a write refused: IS_SLAVE");
                // Still counted by the core as an OpenFlow error.
                false
            }
            _ => false,
        },
        // PACKET_INs reach a standby too (SET_ASYNC in `session_opening`): its core learns
        // hosts (ARP) and links (the master's LLDP), and whatever it would send is dropped
        // (not writable). TCP is the master's: a standby that decided a connection it
        // cannot install would remember a connection that does not exist. The connections
        // it knows come from the switches' flow stats (at connect and on promotion).
        Message::PacketIn(pi) => !cs.is_master_of(dpid) && is_ipv4_tcp(&pi.data),
        _ => false,
    }
}

/// [`on_switch_message`] for a PACKET_IN still in its frame (the core reads those in
/// place): true when a standby must not hand it to the core. Reads it only on a standby's
/// session; a frame that does not read as a PACKET_IN is left to the core, whose reading
/// ends the session.
pub(crate) fn standby_drops_packet_in(
    handle: &Handle,
    features: &ofp::SwitchFeatures,
    frame: &[u8],
) -> bool {
    let cs = &handle.cluster;
    if cs.is_single() || cs.is_master_of(features.datapath_id) {
        return false;
    }
    // What `on_switch_message` decides of a decoded PACKET_IN on a standby's session,
    // read through the view.
    ofp::PacketInView::new(frame).is_ok_and(|v| is_ipv4_tcp(v.data()))
}

/// An untagged Ethernet frame carrying IPv4 TCP.
fn is_ipv4_tcp(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&6)
}

fn set_writable(handle: &Handle, dpid: Dpid, writable: bool) {
    let mut core = handle.lock();
    if let Some(s) = core.sessions.get_mut(&dpid) {
        s.writable = writable;
    }
}

fn demoted_by_switch(handle: &Handle, dpid: Dpid, generation_id: u64, why: &str) {
    let cs = &handle.cluster;
    cs.counters.switch_refusals.fetch_add(1, Ordering::Relaxed);
    set_writable(handle, dpid, false);
    let was = cs.is_master_of(dpid);
    cs.set_switch(dpid, "pending", generation_id, Some(why.to_string()));
    if was {
        cs.counters.demotions.fetch_add(1, Ordering::Relaxed);
    }
    tracing::warn!(
        dpid = format_args!("{dpid:016x}"),
        generation_id,
        why,
        "the switch refused us as master: not writing to it"
    );
}

/// Ask every switch for `role` (MASTER or SLAVE, never EQUAL).
fn request_role_all(handle: &Handle, role: ControllerRole, generation_id: u64) {
    let mut core = handle.lock();
    let dpids: Vec<Dpid> = core.sessions.keys().copied().collect();
    for dpid in dpids {
        if role != ControllerRole::Master
            && let Some(s) = core.sessions.get_mut(&dpid)
        {
            s.writable = false;
        }
        core.outbox.push(
            dpid,
            Message::RoleRequest(RoleMsg {
                role,
                generation_id,
            }),
        );
    }
    core.flush();
    drop(core);
    if role != ControllerRole::Master {
        for (_, w) in handle.cluster.roles().iter_mut() {
            *w = false;
        }
    }
}

/// Re-ask the switches whose role is not confirmed (a refusal, or a request sent before
/// the generation was known).
fn rerequest_pending(handle: &Handle) {
    let cs = &handle.cluster;
    let Some(Message::RoleRequest(req)) = cs.role_request() else {
        return;
    };
    let want = if req.role == ControllerRole::Master {
        "master"
    } else {
        "slave"
    };
    let stale: Vec<Dpid> = {
        let v = cs.view();
        v.switches
            .iter()
            .filter(|(_, s)| s.role != want)
            .filter_map(|(k, _)| u64::from_str_radix(k, 16).ok())
            .collect()
    };
    if stale.is_empty() {
        return;
    }
    let mut core = handle.lock();
    for dpid in stale {
        if core.sessions.contains_key(&dpid) {
            core.outbox.push(dpid, Message::RoleRequest(req));
        }
    }
    core.flush();
}

/// Sessions registered before the cluster task set any role have no entry yet.
fn note_new_switches(handle: &Handle) {
    let cs = &handle.cluster;
    let dpids: Vec<Dpid> = handle.lock().sessions.keys().copied().collect();
    for d in dpids {
        let known = cs.view().switches.contains_key(&format!("{d:016x}"));
        if !known {
            cs.set_switch(d, "pending", 0, None);
        }
    }
}

fn become_master(handle: &Handle, l: &Leadership) {
    let cs = &handle.cluster;
    cs.counters.elections_won.fetch_add(1, Ordering::Relaxed);
    {
        let mut v = cs.view();
        v.mastership = Mastership::Master;
        v.generation_id = l.generation_id();
        v.leader = Some(cs.cfg.instance.clone());
        v.leader_since_unix_ms = Some(unix_ms());
    }
    tracing::info!(instance = %cs.cfg.instance, domain = ?cs.cfg.domain, generation_id = l.generation_id(), "elected: MASTER of the domain's switches");
    if cs.cfg.role == ClusterRole::Domain {
        request_role_all(handle, ControllerRole::Master, l.generation_id());
    }
}

fn step_down(handle: &Handle, why: &str) {
    let cs = &handle.cluster;
    let gen_id = {
        let mut v = cs.view();
        if v.mastership != Mastership::Master {
            return;
        }
        v.mastership = Mastership::Standby;
        v.leader_since_unix_ms = None;
        v.generation_id
    };
    cs.counters.demotions.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(why, "leadership lost: stepping down to SLAVE");
    if cs.cfg.role == ClusterRole::Domain {
        request_role_all(handle, ControllerRole::Slave, gen_id);
    }
}

// ----- the store --------------------------------------------------------------------

static MEMORY: std::sync::OnceLock<flowgate_coord::MemStore> = std::sync::OnceLock::new();

/// The store named by `[cluster] etcd`: `memory:` is one in-process store (tests), anything
/// else etcd endpoints.
async fn connect(cfg: &ClusterConfig) -> Result<Arc<dyn Store>, CoordError> {
    if cfg.etcd.first().is_some_and(|e| e.starts_with("memory:")) {
        return Ok(Arc::new(
            MEMORY.get_or_init(flowgate_coord::MemStore::new).clone(),
        ));
    }
    #[cfg(feature = "etcd")]
    {
        let s = flowgate_coord::etcd::EtcdStore::connect(&cfg.etcd, cfg.store_timeout).await?;
        Ok(Arc::new(s))
    }
    #[cfg(not(feature = "etcd"))]
    {
        Err(CoordError::Other(
            "this flowgate was built without the `etcd` feature".into(),
        ))
    }
}

/// The in-process store behind `etcd = ["memory:"]` (tests).
pub fn memory_store() -> flowgate_coord::MemStore {
    MEMORY.get_or_init(flowgate_coord::MemStore::new).clone()
}

/// Start the cluster task for this instance's role (nothing in single mode).
pub(crate) fn spawn(
    tasks: &mut tokio::task::JoinSet<()>,
    handle: &Handle,
    stop: watch::Receiver<bool>,
) {
    match handle.cluster.cfg.role {
        ClusterRole::Single => {}
        ClusterRole::Domain | ClusterRole::Global => {
            tasks.spawn(member_task(handle.clone(), stop));
        }
    }
}

enum Outcome {
    Stop,
    LeaseLost,
}

/// One lease after another: connect, take a lease, campaign, lead or stand by, until the
/// lease is lost (then again) or the controller stops.
async fn member_task(handle: Handle, mut stop: watch::Receiver<bool>) {
    let cs = handle.cluster.clone();
    let cfg = cs.cfg.clone();
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stop.borrow() {
            return;
        }
        note_new_switches(&handle);
        let attempt = async {
            let store = connect(&cfg).await?;
            let lease = store.grant(cfg.lease_ttl).await?;
            Ok::<_, CoordError>((store, lease))
        };
        let (store, lease) = tokio::select! {
            r = attempt => match r {
                Ok(x) => x,
                Err(e) => {
                    cs.store_failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        backoff = Duration::from_millis(100);
        cs.store_ok();
        match run_lease(&handle, &*store, lease, &mut stop).await {
            Outcome::Stop => return,
            Outcome::LeaseLost => {
                step_down(&handle, "lease expired");
                tracing::warn!("lease lost: campaigning again with a new lease");
            }
        }
    }
}

fn election_of(cfg: &ClusterConfig) -> String {
    match (&cfg.role, &cfg.domain) {
        (ClusterRole::Domain, Some(d)) => keys::domain_election(&cfg.name, d),
        _ => keys::global_election(&cfg.name),
    }
}

fn member_key(cfg: &ClusterConfig) -> String {
    match (&cfg.role, &cfg.domain) {
        (ClusterRole::Domain, Some(d)) => keys::domain_member(&cfg.name, d, &cfg.instance),
        _ => keys::global_member(&cfg.name, &cfg.instance),
    }
}

async fn run_lease(
    handle: &Handle,
    store: &dyn Store,
    lease: LeaseId,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let cs = handle.cluster.clone();
    let cfg = cs.cfg.clone();
    let election = election_of(&cfg);
    let member = json!({ "instance": cfg.instance, "since_unix_ms": unix_ms() }).to_string();
    if let Err(e) = store
        .put(member_key(&cfg), member.into_bytes(), Some(lease))
        .await
    {
        cs.store_failed(&e);
    }
    // Know the current generation before campaigning, so SLAVE requests are not stale.
    observe_leader(handle, store, &election, None).await;
    rerequest_pending(handle);

    let mut leadership: Option<Leadership> = None;
    let mut campaign = store.campaign(election.clone(), cfg.instance.clone().into_bytes(), lease);
    let mut keepalive = tokio::time::interval(cfg.lease_ttl / 4);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut work = tokio::time::interval(cfg.summary_interval);
    work.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_view = Instant::now() - Duration::from_secs(10);
    let mut global = GlobalState::default();
    let mut shared = SharedServices::default();
    let mut refusals = Refusals::default();
    loop {
        tokio::select! {
            r = &mut campaign, if leadership.is_none() => match r {
                Ok(l) => {
                    become_master(handle, &l);
                    leadership = Some(l);
                }
                Err(CoordError::LeaseExpired(_)) => return Outcome::LeaseLost,
                Err(e) => {
                    // A standby's campaign is one long-lived call; its transport being reset
                    // now and then (seen every ~4 s in the lab) is not the store being down.
                    // Reachability is the lease keep-alive's verdict, below; here we only
                    // campaign again.
                    tracing::debug!(error = %e, "campaign interrupted; campaigning again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    campaign = store.campaign(election.clone(), cfg.instance.clone().into_bytes(), lease);
                }
            },
            _ = keepalive.tick() => match store.keep_alive(lease).await {
                Ok(()) => cs.store_ok(),
                Err(CoordError::LeaseExpired(_)) => return Outcome::LeaseLost,
                // Unreachable: keep serving. If another instance takes over meanwhile, the
                // switches fence us (a higher generation_id), and the store refuses our
                // fenced writes.
                Err(e) => cs.store_failed(&e),
            },
            _ = work.tick() => {
                note_new_switches(handle);
                observe_leader(handle, store, &election, leadership.as_ref()).await;
                if let Some(l) = &leadership {
                    let still = cs.view().leader.as_deref() == Some(cfg.instance.as_str());
                    if !still && cs.store_reachable() {
                        return Outcome::LeaseLost;
                    }
                    match cfg.role {
                        ClusterRole::Domain => {
                            if !publish_summary(handle, store, l, lease, &mut refusals).await {
                                return Outcome::LeaseLost;
                            }
                        }
                        ClusterRole::Global => {
                            if !global.decide(handle, store, l).await {
                                return Outcome::LeaseLost;
                            }
                        }
                        ClusterRole::Single => {}
                    }
                }
                if cfg.role == ClusterRole::Domain {
                    shared.sync(handle, store).await;
                    read_spill(handle, store).await;
                    apply_spill(handle);
                }
                rerequest_pending(handle);
                if last_view.elapsed() >= Duration::from_secs(1) {
                    last_view = Instant::now();
                    refresh_cluster_view(handle, store).await;
                }
            },
            _ = stop.changed() => {
                if let Some(l) = leadership.take() {
                    let _ = store.resign(l).await;
                }
                let _ = store.revoke(lease).await;
                return Outcome::Stop;
            }
        }
    }
}

async fn observe_leader(
    handle: &Handle,
    store: &dyn Store,
    election: &str,
    ours: Option<&Leadership>,
) {
    let cs = &handle.cluster;
    match store.leader(election.to_string()).await {
        Ok(kv) => {
            cs.store_ok();
            let mut v = cs.view();
            v.leader = kv.as_ref().map(Kv::value_str);
            if let Some(kv) = &kv {
                let g = kv.create_revision.max(0) as u64;
                if ours.is_none() && g > v.generation_id {
                    v.generation_id = g;
                }
                if ours.is_some_and(|l| l.key != kv.key) {
                    v.leader = Some(kv.value_str());
                }
            }
        }
        Err(e) => cs.store_failed(&e),
    }
}

/// New connections a domain refused for want of a backend, per second and service, folded
/// like the balancer's rates: part of the domain's demand. Without it a domain whose
/// backends are all down would report almost no load (it assigns nothing), and the global
/// controller would account its spill at that.
#[derive(Default)]
struct Refusals {
    last: HashMap<String, (u64, Instant)>,
    rate: HashMap<String, f64>,
}

impl Refusals {
    fn update(&mut self, service: &str, total: u64, now: Instant) -> f64 {
        let rate = self.rate.entry(service.to_string()).or_default();
        if let Some((before, at)) = self.last.get(service) {
            let dt = now.saturating_duration_since(*at).as_secs_f64();
            if dt > 0.0 {
                let inst = total.saturating_sub(*before) as f64 / dt;
                let tau = flowgate_core::service::RATE_TIME_CONSTANT.as_secs_f64();
                *rate += (1.0 - (-dt / tau).exp()) * (inst - *rate);
            }
        }
        self.last.insert(service.to_string(), (total, now));
        *rate
    }
}

/// A domain's aggregated state, per service: what the global controller decides from.
fn domain_summary(handle: &Handle, refusals: &mut Refusals) -> Value {
    let uplink = handle.cluster.cfg.uplink;
    let now = Instant::now();
    let core = handle.lock();
    let c = &core.controller;
    let services: BTreeMap<String, Value> = c
        .services()
        .iter()
        .map(|s| {
            let local: Vec<_> = s.backends.iter().filter(|b| is_local(c, uplink, b)).collect();
            // Eligible: an ejected backend counts while its service's panic waives the
            // ejection (it takes the domain's connections), and is reported as ejected.
            let healthy: Vec<_> = local.iter().filter(|b| b.eligible()).collect();
            let ejected = local.iter().filter(|b| b.ejected).count();
            // The domain's demand: every new connection its clients opened, wherever it
            // went (spilled ones included, so a spill does not undo itself), and those it
            // had to refuse.
            let refused = refusals.update(&s.cfg.name, s.counters.refused_no_backend, now);
            let load: f64 = s.backends.iter().map(|b| b.rps).sum::<f64>() + refused;
            let active: u64 = local.iter().map(|b| u64::from(b.active_connections)).sum();
            let capacity = s.cfg.params.threshold_rps.map(|t| t * healthy.len() as f64);
            (
                s.cfg.name.clone(),
                json!({
                    "backends": local.len(),
                    "healthy": healthy.len(),
                    "ejected": ejected,
                    "load_rps": load,
                    "refused_rps": refused,
                    "active_connections": active,
                    "capacity_rps": capacity,
                    "local_backends": healthy
                        .iter()
                        .map(|b| json!({ "address": b.address.to_string(), "mac": b.mac.map(|m| m.to_string()) }))
                        .collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    json!({ "instance": handle.cluster.cfg.instance, "at_unix_ms": unix_ms(), "services": services })
}

/// A backend of this domain: located on one of its switches, not behind the uplink.
fn is_local(
    c: &flowgate_core::Controller,
    uplink: Option<(u64, u32)>,
    b: &flowgate_core::service::BackendState,
) -> bool {
    b.mac.is_some()
        && c.topology()
            .locate_ip(b.address)
            .is_none_or(|(_, at)| Some((at.dpid, at.port)) != uplink)
}

/// Apply this domain's spill decision to the core's weights: the domain's own backends
/// keep their configured weights (scaled by 100 while spilling), the other domains'
/// backends (placed behind the uplink, with the MAC their domain reported) get weight 0,
/// or while spilling a share such that `fraction` of new connections go to them, split
/// by the targets' weights. Local decisions stay local: this only sets weights.
fn apply_spill(handle: &Handle) {
    let cs = &handle.cluster;
    let Some(uplink) = cs.cfg.uplink else { return };
    let spill = cs.view().spill.clone();
    let now = Instant::now();
    let at = flowgate_core::topology::PortRef::new(uplink.0, uplink.1);
    let mut spilling = false;
    {
        let mut core = handle.lock();
        let c = &mut core.controller;
        let names: Vec<String> = c.services().iter().map(|s| s.cfg.name.clone()).collect();
        for (si, name) in names.iter().enumerate() {
            let d = &spill["services"][name.as_str()];
            let fraction = d["fraction"].as_f64().unwrap_or(0.0).clamp(0.0, 1.0);
            // Remote backends named by the decision: address -> share of the spill.
            let mut remote_share: HashMap<std::net::Ipv4Addr, f64> = HashMap::new();
            if let Some(targets) = d["targets"].as_object() {
                for t in targets.values() {
                    let w = t["weight"].as_f64().unwrap_or(0.0);
                    let list = t["backends"].as_array().cloned().unwrap_or_default();
                    let n = list.len().max(1) as f64;
                    for b in list {
                        let (Some(ip), Some(mac)) = (
                            b["address"].as_str().and_then(|a| a.parse().ok()),
                            b["mac"]
                                .as_str()
                                .and_then(|m| m.parse::<flowgate_packet::MacAddr>().ok()),
                        ) else {
                            continue;
                        };
                        if c.place_remote_backend(now, ip, mac, at) {
                            *remote_share.entry(ip).or_default() += w / n;
                        }
                    }
                }
            }
            let Some(s) = c.services().get(si) else {
                continue;
            };
            let local_total: u64 = s
                .backends
                .iter()
                .zip(&s.cfg.backends)
                .filter(|(b, _)| is_local(c, Some(uplink), b))
                .map(|(_, cfg)| u64::from(cfg.weight) * 100)
                .sum();
            let active = fraction > 0.0 && !remote_share.is_empty();
            // Σremote / (Σlocal + Σremote) = fraction.
            let remote_total = if fraction >= 0.999 || local_total == 0 {
                100_000.0
            } else {
                fraction / (1.0 - fraction) * local_total as f64
            };
            let plan: Vec<(usize, u32, bool)> = s
                .backends
                .iter()
                .zip(&s.cfg.backends)
                .enumerate()
                .map(|(bi, (b, cfg))| {
                    let local = is_local(c, Some(uplink), b);
                    let w = if local {
                        if active {
                            cfg.weight.saturating_mul(100)
                        } else {
                            cfg.weight
                        }
                    } else if active {
                        let share = remote_share.get(&b.address).copied().unwrap_or(0.0);
                        (share * remote_total).round().clamp(0.0, 1_000_000.0) as u32
                    } else {
                        0
                    };
                    // Remote: located behind the uplink (one not located yet is neither).
                    (bi, w, !local && b.mac.is_some())
                })
                .collect();
            spilling |= active;
            for (bi, w, remote) in plan {
                if c.services()
                    .get(si)
                    .and_then(|s| s.backends.get(bi))
                    .is_some_and(|b| b.weight != w || b.remote != remote)
                {
                    c.set_spill_weight(si, bi, w, remote);
                }
            }
        }
    }
    let mut v = cs.view();
    if spilling && v.spill_applied_unix_ms.is_none() {
        v.spill_applied_unix_ms = Some(unix_ms());
        tracing::info!("spilling: new connections go partly to other domains' backends");
    } else if !spilling && v.spill_applied_unix_ms.is_some() {
        v.spill_applied_unix_ms = None;
        tracing::info!("spill over: new connections stay in the domain");
    }
}

/// The services every domain shares, from the store (`/flowgate/<cluster>/services`: the
/// `[[service]]` tables of a config file, in TOML). An operator changes a pool once
/// (`etcdctl put /flowgate/<cluster>/services "$(cat services.toml)"`) and every domain
/// instance applies it as a reload: live connections and learned state are kept.
#[derive(Default)]
struct SharedServices {
    revision: i64,
    services: Option<Vec<flowgate_core::config::ServiceConfig>>,
}

impl SharedServices {
    async fn sync(&mut self, handle: &Handle, store: &dyn Store) {
        let cs = &handle.cluster;
        let kv = match store.get(keys::services(&cs.cfg.name)).await {
            Ok(Some(kv)) => kv,
            Ok(None) => return,
            Err(e) => {
                cs.store_failed(&e);
                return;
            }
        };
        if kv.mod_revision != self.revision {
            self.revision = kv.mod_revision;
            match flowgate_core::Config::from_toml(&kv.value_str(), &|_| None) {
                Ok(c) => self.services = Some(c.services),
                Err(e) => {
                    tracing::error!(revision = kv.mod_revision, error = %e, "shared services in the store are invalid: keeping the current ones");
                    self.services = None;
                }
            }
        }
        let Some(services) = &self.services else {
            return;
        };
        let now = Instant::now();
        let mut core = handle.lock();
        let mut config = handle
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if &config.services == services {
            return;
        }
        config.services = services.clone();
        core.with(|c, out| c.reload(now, &config, out));
        *handle.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
        tracing::info!(
            services = services.len(),
            revision = self.revision,
            "services from the store applied"
        );
    }
}

async fn publish_summary(
    handle: &Handle,
    store: &dyn Store,
    l: &Leadership,
    lease: LeaseId,
    refusals: &mut Refusals,
) -> bool {
    let cs = &handle.cluster;
    let Some(domain) = cs.cfg.domain.clone() else {
        return true;
    };
    let summary = domain_summary(handle, refusals).to_string();
    match store
        .fenced_put(
            l.clone(),
            keys::domain_summary(&cs.cfg.name, &domain),
            summary.into_bytes(),
            Some(lease),
        )
        .await
    {
        Ok(true) => true,
        Ok(false) => {
            cs.counters
                .fenced_writes_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!("fenced write refused by the store: no longer the leader");
            false
        }
        Err(CoordError::LeaseExpired(_)) => false,
        Err(e) => {
            cs.store_failed(&e);
            true
        }
    }
}

async fn read_spill(handle: &Handle, store: &dyn Store) {
    let cs = &handle.cluster;
    let Some(domain) = cs.cfg.domain.clone() else {
        return;
    };
    match store.get(keys::spill(&cs.cfg.name, &domain)).await {
        Ok(kv) => {
            let spill: Value = kv
                .and_then(|kv| serde_json::from_slice(&kv.value).ok())
                .unwrap_or(Value::Null);
            let changed = cs.view().spill != spill;
            if changed {
                tracing::info!(spill = %spill, "spill decision from the global controller");
                cs.view().spill = spill;
            }
        }
        Err(e) => cs.store_failed(&e),
    }
}

/// The cluster as the store shows it, for the API: domains with master, standbys,
/// summary and spill; the global controllers.
async fn refresh_cluster_view(handle: &Handle, store: &dyn Store) {
    let cs = &handle.cluster;
    let root = format!("{}/", keys::root(&cs.cfg.name));
    let Ok(all) = store.list(root.clone()).await else {
        return;
    };
    let mut domains: BTreeMap<String, Value> = BTreeMap::new();
    let mut global_members = Vec::new();
    let mut global_leader: Option<(i64, String)> = None;
    let mut domain_leaders: HashMap<String, (i64, String)> = HashMap::new();
    for kv in &all {
        let rest = kv.key.strip_prefix(&root).unwrap_or(&kv.key);
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["domain", d, "members", inst] => {
                let e = domains.entry((*d).to_string()).or_insert_with(|| json!({}));
                if let Some(arr) = e
                    .as_object_mut()
                    .map(|o| o.entry("instances").or_insert_with(|| json!([])))
                    && let Some(a) = arr.as_array_mut()
                {
                    a.push(json!(inst));
                }
            }
            ["domain", d, "leader", _] => {
                let cur = domain_leaders
                    .entry((*d).to_string())
                    .or_insert((i64::MAX, String::new()));
                if kv.create_revision < cur.0 {
                    *cur = (kv.create_revision, kv.value_str());
                }
            }
            ["domain", d, "summary"] => {
                let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
                domains.entry((*d).to_string()).or_insert_with(|| json!({}))["summary"] = v;
            }
            ["spill", d] => {
                let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
                domains.entry((*d).to_string()).or_insert_with(|| json!({}))["spill"] = v;
            }
            ["global", "members", inst] => global_members.push(json!(inst)),
            ["global", "leader", _]
                if global_leader
                    .as_ref()
                    .is_none_or(|(r, _)| kv.create_revision < *r) =>
            {
                global_leader = Some((kv.create_revision, kv.value_str()));
            }
            _ => {}
        }
    }
    for (d, (rev, inst)) in domain_leaders {
        let e = domains.entry(d).or_insert_with(|| json!({}));
        e["master"] = json!(inst);
        e["generation_id"] = json!(rev);
    }
    for e in domains.values_mut() {
        let master = e["master"].clone();
        let standbys: Vec<Value> = e["instances"]
            .as_array()
            .map(|a| a.iter().filter(|i| **i != master).cloned().collect())
            .unwrap_or_default();
        e["standbys"] = json!(standbys);
    }
    let view = json!({
        "domains": domains,
        "global": {
            "active": global_leader.as_ref().map(|(_, i)| i.clone()),
            "generation_id": global_leader.as_ref().map(|(r, _)| *r),
            "instances": global_members,
        },
    });
    cs.view().cluster = view;
}

// ----- the global controller --------------------------------------------------------

/// The active global controller's memory: the spill policy (hysteresis, decisions in
/// force) and what it last wrote. Kept across decisions for as long as this instance
/// leads; a newly elected one starts from the decisions in the store.
#[derive(Default)]
struct GlobalState {
    policy: Option<SpillPolicy>,
    written: HashMap<String, String>,
}

fn spill_params(cfg: &ClusterConfig) -> SpillParams {
    SpillParams {
        threshold: cfg.spill_threshold,
        exit_threshold: cfg.spill_exit_threshold,
        hold: cfg.spill_hold,
        step: cfg.spill_step,
    }
}

impl GlobalState {
    /// The policy, seeded on first use from the decisions currently in the store (a
    /// failover must not reset every spill). None if the store cannot be read yet.
    async fn policy(&mut self, handle: &Handle, store: &dyn Store) -> Option<&mut SpillPolicy> {
        let cs = &handle.cluster;
        if self.policy.is_none() {
            let prefix = keys::spills(&cs.cfg.name);
            let in_force = match store.list(prefix.clone()).await {
                Ok(a) => a,
                Err(e) => {
                    cs.store_failed(&e);
                    return None;
                }
            };
            let mut policy = SpillPolicy::new(spill_params(&cs.cfg));
            let now = Instant::now();
            for kv in in_force {
                let Some(domain) = kv.key.strip_prefix(&prefix) else {
                    continue;
                };
                match SpillDecision::from_json(&kv.value) {
                    Ok(d) => {
                        policy.seed(domain, &d, now);
                        self.written.insert(domain.to_string(), d.to_json());
                    }
                    Err(e) => {
                        tracing::warn!(domain, error = %e, "unreadable spill decision in the store: ignored")
                    }
                }
            }
            tracing::info!(
                decisions = self.written.len(),
                "global controller active: starting from the spill decisions in the store"
            );
            self.policy = Some(policy);
        }
        self.policy.as_mut()
    }

    /// Read every domain's summary, decide every domain's spill, write what changed
    /// (fenced). False when the store refused a fenced write: we no longer lead.
    async fn decide(&mut self, handle: &Handle, store: &dyn Store, l: &Leadership) -> bool {
        let cs = &handle.cluster;
        let prefix = keys::domains(&cs.cfg.name);
        let all = match store.list(prefix.clone()).await {
            Ok(a) => a,
            Err(e) => {
                cs.store_failed(&e);
                return true;
            }
        };
        let summaries: BTreeMap<String, DomainSummary> = all
            .iter()
            .filter_map(|kv| {
                let rest = kv.key.strip_prefix(&prefix)?;
                let d = rest.strip_suffix("/summary")?;
                match DomainSummary::from_json(&kv.value) {
                    Ok(s) => Some((d.to_string(), s)),
                    Err(e) => {
                        tracing::warn!(domain = d, error = %e, "unreadable domain summary: ignored");
                        None
                    }
                }
            })
            .collect();
        let Some(policy) = self.policy(handle, store).await else {
            return true;
        };
        let decisions = policy.decide(&summaries, Instant::now());
        for (domain, decision) in decisions {
            let text = decision.to_json();
            if self.written.get(&domain) == Some(&text) {
                continue;
            }
            match store
                .fenced_put(
                    l.clone(),
                    keys::spill(&cs.cfg.name, &domain),
                    text.clone().into_bytes(),
                    None,
                )
                .await
            {
                Ok(true) => {
                    tracing::info!(domain, spill = %text, "spill decision written");
                    self.written.insert(domain, text);
                }
                Ok(false) => {
                    cs.counters
                        .fenced_writes_refused
                        .fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                Err(e) => {
                    cs.store_failed(&e);
                    return true;
                }
            }
        }
        cs.view().spill = json!({ "summaries": summaries.len(), "decisions": self.written.len() });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_count_as_demand() {
        let mut r = Refusals::default();
        let t0 = Instant::now();
        assert_eq!(r.update("web", 0, t0), 0.0);
        // 100 refusals/s for 5 s: the folded rate approaches 100.
        let mut rate = 0.0;
        for i in 1..=25u64 {
            rate = r.update("web", i * 20, t0 + Duration::from_millis(200 * i));
        }
        assert!((95.0..=100.0).contains(&rate), "{rate}");
        // A counter that went backwards (a reload) is no negative demand.
        let after = r.update("web", 0, t0 + Duration::from_millis(5200));
        assert!((0.0..rate).contains(&after), "{after}");
    }

    #[test]
    fn slaves_may_only_read() {
        assert!(is_write(&Message::PacketOut(ofp::PacketOut {
            buffer_id: ofp::NO_BUFFER,
            in_port: ofp::port::CONTROLLER,
            actions: Vec::new().into(),
            data: bytes::Bytes::new(),
        })));
        assert!(!is_write(&Message::BarrierRequest));
        assert!(!is_write(&Message::RoleRequest(RoleMsg {
            role: ControllerRole::Slave,
            generation_id: 1
        })));
    }

    /// A domain controller's spill sets its backends' weights from their configured ones
    /// at every keep-alive. A weight the operator set through the API is the configured
    /// one from then on: the spill keeps it, and scales it while spilling (it once put
    /// the file's weight back within a second).
    #[test]
    fn an_operators_weight_outlives_the_spill_decisions() {
        use flowgate_core::testkit::sim::{Sim, arp_request, ip};
        let text = r#"
[cluster]
role = "domain"
name = "t"
instance = "d1a"
domain = "d1"
dpids = ["0000000000000001"]
uplink = "0000000000000001:4"
etcd = ["memory:"]
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "weighted-round-robin"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service.backend]]
address = "10.0.0.20"
weight = 0
"#;
        let config = flowgate_core::Config::from_toml(text, &|_| None).expect("valid config");
        let mut sim = Sim::new(text, &[(1, 4)], &[], &[("h2", 1, 2), ("h3", 1, 3)]);
        for i in [2, 3] {
            sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
        }
        let handle = Handle::new(sim.c, config, None);
        let weights = |h: &Handle| -> Vec<u32> {
            h.lock().controller.services()[0]
                .backends
                .iter()
                .map(|b| b.weight)
                .collect()
        };
        apply_spill(&handle);
        assert_eq!(
            weights(&handle),
            [1, 1, 0],
            "no spill: the configured weights"
        );
        assert!(handle.lock().with(|c, _| c.set_weight(0, 0, 5)));
        apply_spill(&handle);
        assert_eq!(weights(&handle), [5, 1, 0], "the operator's weight stays");
        // Half the new connections to another domain's backend: the local weights are
        // scaled by 100, the remote one gets as much as all of them.
        handle.cluster.view().spill = json!({ "services": { "web": {
            "fraction": 0.5,
            "targets": { "d2": { "weight": 1.0, "backends": [
                { "address": "10.0.0.20", "mac": "02:00:00:00:00:20" } ] } } } } });
        apply_spill(&handle);
        assert_eq!(weights(&handle), [500, 100, 600]);
        // The other domain's backend is marked as such: it does not count toward the
        // pool's panic threshold (`ServiceState::in_panic`), the domain's own do.
        let remote: Vec<bool> = handle.lock().controller.services()[0]
            .backends
            .iter()
            .map(|b| b.remote)
            .collect();
        assert_eq!(remote, [false, false, true]);
        handle.cluster.view().spill = Value::Null;
        apply_spill(&handle);
        assert_eq!(weights(&handle), [5, 1, 0], "spill over");
    }
}
