//! One task per backend, kept in step with the pools: the probes and the metrics scrapes
//! both need a task for each backend that wants one, started when a backend appears (or
//! its settings change) and stopped when it goes.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use flowgate_core::Controller;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Handle;

/// How often the pools are compared with the running tasks.
const RECONCILE_EVERY: Duration = Duration::from_millis(500);

/// Run `task(handle, key, settings)` for every `(key, settings)` that `wanted` lists, until
/// `stop`; a task whose key disappears, or whose settings change, is aborted (and, for a
/// change, started again).
pub(super) async fn supervise<K, C, Fut>(
    handle: Handle,
    mut stop: watch::Receiver<bool>,
    wanted: impl Fn(&Controller) -> Vec<(K, C)>,
    task: impl Fn(Handle, K, C) -> Fut,
) where
    K: Clone + Eq + Hash,
    C: Clone + PartialEq,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut running: HashMap<K, (C, JoinHandle<()>)> = HashMap::new();
    let mut tick = tokio::time::interval(RECONCILE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now_wanted = wanted(&handle.lock().controller);
        running.retain(|k, (cfg, t)| {
            let keep = now_wanted.iter().any(|(w, c)| w == k && c == cfg);
            if !keep {
                t.abort();
            }
            keep
        });
        for (k, cfg) in now_wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(k.clone()) {
                let t = tokio::spawn(task(handle.clone(), k, cfg.clone()));
                slot.insert((cfg, t));
            }
        }
    }
    for (_, (_, t)) in running {
        t.abort();
    }
}
