//! The etcd v3 backend of [`Store`] (the `etcd` feature; building it needs `protoc`).
//!
//! Elections use etcd's own election service (`v3election`), whose leader key is
//! `<election>/<lease in hex>`: the same layout [`crate::MemStore`] uses. Every call but
//! `campaign` has a deadline, after which it fails with [`CoordError::Unavailable`].

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaderKey, PutOptions, ResignOptions,
    Txn, TxnOp,
};

use crate::{BoxFuture, CoordError, Kv, Leadership, LeaseId, Result, Revision, Store, ttl_secs};

/// A [`Store`] on an etcd v3 cluster.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    /// Without a per-request timeout: a campaign waits as long as another candidate leads.
    campaign_client: Client,
    timeout: Duration,
}

fn unavailable(e: etcd_client::Error) -> CoordError {
    CoordError::Unavailable(e.to_string())
}

fn kv_of(kv: &etcd_client::KeyValue) -> Kv {
    Kv {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
    }
}

impl EtcdStore {
    /// Connect to `endpoints` (`http://127.0.0.1:2379`, ...). `timeout` bounds each call.
    pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdStore> {
        let base = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(Duration::from_secs(1), timeout);
        let connect = |opts: ConnectOptions| async move {
            tokio::time::timeout(timeout * 2, Client::connect(endpoints, Some(opts)))
                .await
                .map_err(|_| CoordError::Unavailable("connect timed out".into()))?
                .map_err(unavailable)
        };
        let client = connect(base.clone().with_timeout(timeout)).await?;
        let campaign_client = connect(base).await?;
        Ok(EtcdStore {
            client,
            campaign_client,
            timeout,
        })
    }

    async fn deadline<T>(
        &self,
        f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(unavailable),
            Err(_) => Err(CoordError::Unavailable(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }
}

impl Store for EtcdStore {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = self.deadline(c.lease_grant(ttl_secs(ttl), None)).await?;
            Ok(LeaseId(r.id()))
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let once = async {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease.0).await?;
                keeper.keep_alive().await?;
                stream.message().await
            };
            match self.deadline(once).await? {
                Some(r) if r.ttl() > 0 => Ok(()),
                _ => Err(CoordError::LeaseExpired(lease.0)),
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            match self.deadline(c.lease_revoke(lease.0)).await {
                Ok(_) => Ok(()),
                // Already gone is what we wanted.
                Err(CoordError::Unavailable(m)) if m.contains("not found") => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn put(
        &self,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<Revision>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let opts = lease.map(|l| PutOptions::new().with_lease(l.0));
            let r = self.deadline(c.put(key, value, opts)).await;
            match r {
                Ok(r) => Ok(r.header().map(|h| h.revision()).unwrap_or(0)),
                Err(CoordError::Unavailable(m)) if m.contains("lease not found") => {
                    Err(CoordError::LeaseExpired(lease.map(|l| l.0).unwrap_or(0)))
                }
                Err(e) => Err(e),
            }
        })
    }

    fn get(&self, key: String) -> BoxFuture<'_, Result<Option<Kv>>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = self.deadline(c.get(key, None)).await?;
            Ok(r.kvs().first().map(kv_of))
        })
    }

    fn list(&self, prefix: String) -> BoxFuture<'_, Result<Vec<Kv>>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = self
                .deadline(c.get(prefix, Some(GetOptions::new().with_prefix())))
                .await?;
            Ok(r.kvs().iter().map(kv_of).collect())
        })
    }

    fn delete(&self, key: String) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            self.deadline(c.delete(key, None)).await?;
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
            let mut c = self.campaign_client.clone();
            // No deadline: a campaign waits for as long as another candidate leads. The
            // caller races it with its lease keep-alive.
            let r = c
                .campaign(election.clone(), value, lease.0)
                .await
                .map_err(unavailable)?;
            let l = r.leader().ok_or_else(|| {
                CoordError::Other("campaign answered without a leader key".into())
            })?;
            Ok(Leadership {
                election,
                key: String::from_utf8_lossy(l.key()).into_owned(),
                revision: l.rev(),
                lease,
            })
        })
    }

    fn leader(&self, election: String) -> BoxFuture<'_, Result<Option<Kv>>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            match self.deadline(c.leader(election)).await {
                Ok(r) => Ok(r.kv().map(kv_of)),
                // etcd answers "election: no leader" as an error.
                Err(CoordError::Unavailable(m)) if m.contains("no leader") => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn fenced_put(
        &self,
        leadership: Leadership,
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let opts = lease.map(|l| PutOptions::new().with_lease(l.0));
            let txn = Txn::new()
                .when([Compare::create_revision(
                    leadership.key.clone(),
                    CompareOp::Equal,
                    leadership.revision,
                )])
                .and_then([TxnOp::put(key, value, opts)]);
            let r = self.deadline(c.txn(txn)).await?;
            Ok(r.succeeded())
        })
    }

    fn resign(&self, leadership: Leadership) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let key = LeaderKey::new()
                .with_name(leadership.election.clone())
                .with_key(leadership.key.clone())
                .with_rev(leadership.revision)
                .with_lease(leadership.lease.0);
            self.deadline(c.resign(Some(ResignOptions::new().with_leader(key))))
                .await?;
            Ok(())
        })
    }
}
