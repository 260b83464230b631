//! [`Coordination`] over an etcd cluster (etcd's v3 API, through
//! `etcd-client`).

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions,
    TxnOpResponse, WatchOptions,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use super::{
    Changes, Condition, Coordination, CoordinationError, Entry, LeaseId, Snapshot, Txn, TxnAnswer,
    Write,
};

/// A connection to etcd (its client multiplexes calls over one channel,
/// and a clone shares it).
#[derive(Clone)]
pub struct EtcdCoordination {
    client: Client,
}

impl std::fmt::Debug for EtcdCoordination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordination").finish_non_exhaustive()
    }
}

fn unavailable(error: etcd_client::Error) -> CoordinationError {
    CoordinationError::Unavailable(error.to_string())
}

fn entry(kv: &etcd_client::KeyValue) -> Entry {
    Entry {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    }
}

impl EtcdCoordination {
    /// Connects to `endpoints` and checks that etcd answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, CoordinationError> {
        let connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        let mut client = Client::connect(endpoints, Some(connect))
            .await
            .map_err(unavailable)?;
        client.status().await.map_err(unavailable)?;
        Ok(Self { client })
    }

    fn client(&self) -> Client {
        self.client.clone()
    }
}

impl Coordination for EtcdCoordination {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, CoordinationError>> {
        let key = key.to_owned();
        async move {
            let answer = self.client().get(key, None).await.map_err(unavailable)?;
            Ok(answer.kvs().first().map(entry))
        }
        .boxed()
    }

    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<Snapshot, CoordinationError>> {
        let prefix = prefix.to_owned();
        async move {
            let answer = self
                .client()
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(unavailable)?;
            Ok(Snapshot {
                revision: answer.header().map_or(0, |h| h.revision()),
                entries: answer.kvs().iter().map(entry).collect(),
            })
        }
        .boxed()
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnAnswer, CoordinationError>> {
        async move {
            let when: Vec<Compare> = txn
                .when
                .into_iter()
                .map(|condition| match condition {
                    Condition::Absent(key) => Compare::version(key, CompareOp::Equal, 0),
                    Condition::ModRevision(key, revision) => {
                        Compare::mod_revision(key, CompareOp::Equal, revision)
                    }
                })
                .collect();
            let then: Vec<etcd_client::TxnOp> = txn
                .then
                .into_iter()
                .map(|write| match write {
                    Write::Put { key, value, lease } => etcd_client::TxnOp::put(
                        key,
                        value,
                        lease.map(|lease| PutOptions::new().with_lease(lease)),
                    ),
                    Write::Delete(key) => etcd_client::TxnOp::delete(key, None),
                    Write::DeletePrefix(prefix) => {
                        etcd_client::TxnOp::delete(prefix, Some(DeleteOptions::new().with_prefix()))
                    }
                })
                .collect();
            let mut request = etcd_client::Txn::new().when(when).and_then(then);
            if let Some(key) = txn.otherwise_get {
                request = request.or_else([etcd_client::TxnOp::get(key, None)]);
            }
            let answer = self.client().txn(request).await.map_err(unavailable)?;
            let got = answer
                .op_responses()
                .into_iter()
                .find_map(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().first().map(entry),
                    _ => None,
                })
                .filter(|_| !answer.succeeded());
            Ok(TxnAnswer {
                succeeded: answer.succeeded(),
                revision: answer.header().map_or(0, |h| h.revision()),
                got,
            })
        }
        .boxed()
    }

    fn watch(
        &self,
        prefix: &str,
        from_revision: i64,
    ) -> BoxFuture<'_, Result<Changes, CoordinationError>> {
        let prefix = prefix.to_owned();
        async move {
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from_revision + 1);
            let stream = self
                .client()
                .watch(prefix, Some(options))
                .await
                .map_err(unavailable)?;
            let changes = stream
                .take_while(|answer| {
                    std::future::ready(answer.as_ref().map_or(true, |a| !a.canceled()))
                })
                .filter_map(move |answer| {
                    std::future::ready(match answer {
                        Ok(answer) if answer.events().is_empty() => None,
                        Ok(answer) => Some(Ok(answer
                            .events()
                            .iter()
                            .filter_map(|event| event.kv().map(etcd_client::KeyValue::mod_revision))
                            .max()
                            .unwrap_or(from_revision))),
                        Err(error) => Some(Err(unavailable(error))),
                    })
                });
            Ok(changes.boxed())
        }
        .boxed()
    }

    fn grant_lease(&self, ttl: Duration) -> BoxFuture<'_, Result<LeaseId, CoordinationError>> {
        async move {
            let secs = ttl.as_secs().max(2) as i64;
            let granted = self
                .client()
                .lease_grant(secs, None)
                .await
                .map_err(unavailable)?;
            Ok(granted.id())
        }
        .boxed()
    }

    fn keep_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>> {
        async move {
            let (mut keeper, mut answers) = self
                .client()
                .lease_keep_alive(lease)
                .await
                .map_err(unavailable)?;
            keeper.keep_alive().await.map_err(unavailable)?;
            match answers.message().await.map_err(unavailable)? {
                Some(answer) => Ok(answer.ttl() > 0),
                None => Ok(false),
            }
        }
        .boxed()
    }

    fn lease_alive(&self, lease: LeaseId) -> BoxFuture<'_, Result<bool, CoordinationError>> {
        async move {
            let answer = self
                .client()
                .lease_time_to_live(lease, None)
                .await
                .map_err(unavailable)?;
            Ok(answer.ttl() > 0)
        }
        .boxed()
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), CoordinationError>> {
        async move {
            self.client()
                .lease_revoke(lease)
                .await
                .map_err(unavailable)?;
            Ok(())
        }
        .boxed()
    }

    fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: LeaseId,
    ) -> BoxFuture<'_, Result<(), CoordinationError>> {
        let (election, value) = (election.to_owned(), value.to_owned());
        async move {
            match self
                .client()
                .election_client()
                .campaign(election, value, lease)
                .await
            {
                Ok(_) => Ok(()),
                Err(etcd_client::Error::GRpcStatus(status))
                    if status.code() == tonic::Code::Cancelled =>
                {
                    Err(CoordinationError::CampaignTimedOut)
                }
                Err(error) => Err(unavailable(error)),
            }
        }
        .boxed()
    }

    fn leader(&self, election: &str) -> BoxFuture<'_, Result<Option<String>, CoordinationError>> {
        let election = election.to_owned();
        async move {
            match self.client().election_client().leader(election).await {
                Ok(mut answer) => Ok(answer
                    .take_kv()
                    .and_then(|kv| kv.value_str().ok().map(str::to_owned))),
                // No campaigner yet is an error in etcd's API.
                Err(_) => Ok(None),
            }
        }
        .boxed()
    }
}
