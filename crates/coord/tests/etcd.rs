//! The etcd backend against a real etcd (started here on free loopback ports): the same
//! conformance checks as the in-memory store.
#![cfg(feature = "etcd")]

use std::time::Duration;

use flowgate_coord::etcd::EtcdStore;
use flowgate_coord::process::{EtcdCluster, etcd_available};
use flowgate_coord::{CoordError, Store, conformance};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_conformance() {
    if !etcd_available() {
        eprintln!("SKIP etcd_store_conformance: no etcd binary (apt-get install etcd-server)");
        return;
    }
    let etcd = EtcdCluster::start("conformance", 1).expect("start etcd");
    let store = EtcdStore::connect(&etcd.endpoints(), Duration::from_secs(2))
        .await
        .expect("connect");
    if let Err(e) = conformance::run(&store, "/conformance").await {
        panic!("{e}\n{}", etcd.logs());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_is_unavailable_not_a_hang() {
    if !etcd_available() {
        eprintln!("SKIP: no etcd binary");
        return;
    }
    let mut etcd = EtcdCluster::start("down", 1).expect("start etcd");
    let store = EtcdStore::connect(&etcd.endpoints(), Duration::from_millis(500))
        .await
        .expect("connect");
    store
        .put("/k".into(), b"v".to_vec(), None)
        .await
        .expect("put");
    etcd.kill(0);
    let t = std::time::Instant::now();
    let r = store.get("/k".into()).await;
    assert!(matches!(r, Err(CoordError::Unavailable(_))), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
}
