//! The receiver's side of a move's data: the copy, page by page, counted
//! in the move's record; the catch-up rounds; the pages taken into this
//! node's store; the moved queues' settings.

use std::sync::Arc;
use std::time::Duration;

use super::MoveRecord;
use crate::cluster::coordination::Coordination;
use crate::cluster::protocol::{self, Keys};
use crate::cluster::{Cluster, ClusterError};
use crate::ingest::PartitionUrl;
use crate::record::UrlRecord;

/// A move's record as the receiver advances it, written back to etcd
/// conditionally on the revision it last wrote or read.
pub(super) struct Progress {
    pub(super) etcd: Arc<dyn Coordination>,
    pub(super) keys: Keys,
    pub(super) revision: i64,
    pub(super) record: MoveRecord,
    written: std::time::Instant,
}

/// How often a copy writes its progress to etcd.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

impl Progress {
    pub(super) fn new(
        etcd: Arc<dyn Coordination>,
        keys: Keys,
        revision: i64,
        record: MoveRecord,
    ) -> Self {
        Self {
            etcd,
            keys,
            revision,
            record,
            written: std::time::Instant::now(),
        }
    }

    /// A copy starts from nothing.
    pub(super) fn restart(&mut self) {
        self.record.copied = 0;
        self.record.copied_bytes = 0;
    }

    /// Counts a copied page; writes the counts about every second, so
    /// `frontier cluster` shows them (and a move rolled back meanwhile
    /// stops its copy).
    async fn copied(&mut self, urls: u64, bytes: u64) -> Result<(), ClusterError> {
        self.record.copied += urls;
        self.record.copied_bytes += bytes;
        if self.written.elapsed() >= PROGRESS_EVERY {
            self.write().await?;
        }
        Ok(())
    }

    pub(super) async fn write(&mut self) -> Result<(), ClusterError> {
        let txn = protocol::update_move(&self.keys, self.revision, &self.record);
        self.revision = super::written(&*self.etcd, txn, &self.keys, self.record.partition).await?;
        self.written = std::time::Instant::now();
        Ok(())
    }
}

pub(super) type AdminPeer = proto::admin::admin_client::AdminClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        proto::bearer::Bearer,
    >,
>;

/// Pages through the owner's copy of a partition into this node's store,
/// counting in `progress`.
pub(super) async fn copy_whole(
    cluster: &Cluster,
    admin: &mut AdminPeer,
    partition: u32,
    track: bool,
    progress: &mut Progress,
) -> Result<(), ClusterError> {
    let mut after: Option<proto::admin::PartitionKey> = None;
    loop {
        let request = proto::admin::CopyPartitionRequest {
            track: track && after.is_none(),
            ..page_request(cluster, partition, after.clone())
        };
        let page = admin.copy_partition(request).await?.into_inner();
        let end = page.end;
        after = page.urls.last().map(|last| proto::admin::PartitionKey {
            crawl_id: last.crawl_id.clone(),
            url: last.url.clone(),
        });
        let bytes: usize = page
            .urls
            .iter()
            .map(|u| u.crawl_id.len() + u.url.len() + u.record.len())
            .sum();
        let urls = decode_page(page.urls)?;
        let count = urls.len() as u64;
        take(cluster, partition, urls).await?;
        progress.copied(count, bytes as u64).await?;
        fail::fail_point!("move-copy-page", |_| Err(crate::failpoint::hit(
            "move-copy-page"
        )
        .into()));
        if end || after.is_none() {
            return Ok(());
        }
    }
}

/// A new replica whose copy here followed the partition's leader (and was
/// taken out of its in-sync set since): asks the leader to seed the
/// catch-up rounds with the keys it noted for this node since, which
/// bring the copy up to date without copying it whole. Answers how many
/// it noted; `None` when this copy followed another node, or the leader
/// cannot say what it misses (it restarted, led the partition only since,
/// noted too much, or a deletion came): the partition is copied whole.
pub(super) async fn seed_from_log(
    cluster: &Cluster,
    admin: &mut AdminPeer,
    record: &MoveRecord,
) -> Result<Option<u64>, ClusterError> {
    let partition = record.partition;
    let frontier = Arc::clone(&cluster.frontier);
    let followed =
        tokio::task::spawn_blocking(move || frontier.ingest().followed_leader(partition))
            .await?
            .map_err(|e| ClusterError::Local(e.to_string()))?;
    if record.kind != crate::cluster::map::MoveKind::Replica
        || followed.as_deref() != Some(record.from.as_str())
    {
        return Ok(None);
    }
    let request = proto::admin::CopyPartitionRequest {
        lag_of: cluster.options.node_id.clone(),
        ..page_request(cluster, partition, None)
    };
    let answer = admin.copy_partition(request).await?.into_inner();
    Ok(answer.tracked.then_some(answer.round_urls))
}

/// Catch-up rounds at most before a cutover.
const CATCH_UP_ROUNDS: usize = 4;

/// After the copy, before the seal: rounds that each take what was written
/// to the partition during the one before (the first, during the copy),
/// until a round is smaller than a page. The sealed tail is then only what
/// arrives during the last, short round, and so is the cutover's pause.
/// Answers the URLs taken.
pub(super) async fn catch_up(
    cluster: &Cluster,
    admin: &mut AdminPeer,
    partition: u32,
) -> Result<u64, ClusterError> {
    let mut taken = 0;
    for _ in 0..CATCH_UP_ROUNDS {
        let mut after: Option<proto::admin::PartitionKey> = None;
        let mut round = 0;
        loop {
            let request = proto::admin::CopyPartitionRequest {
                catch_up: true,
                ..page_request(cluster, partition, after.clone())
            };
            let page = admin.copy_partition(request).await?.into_inner();
            if !page.tracked {
                // No round to take (a deletion reached the partition, or
                // the owner restarted): the seal says so and the cutover
                // copies the partition whole.
                return Ok(taken);
            }
            if after.is_none() {
                round = page.round_urls;
            }
            let end = page.end;
            after = page.urls.last().map(|last| proto::admin::PartitionKey {
                crawl_id: last.crawl_id.clone(),
                url: last.url.clone(),
            });
            let urls = decode_page(page.urls)?;
            taken += urls.len() as u64;
            take(cluster, partition, urls).await?;
            if end || after.is_none() {
                break;
            }
        }
        if round <= u64::from(cluster.options.move_page_urls) {
            break;
        }
    }
    Ok(taken)
}

/// A page of the partition after `after`, this node's page size.
fn page_request(
    cluster: &Cluster,
    partition: u32,
    after: Option<proto::admin::PartitionKey>,
) -> proto::admin::CopyPartitionRequest {
    proto::admin::CopyPartitionRequest {
        partition,
        after,
        limit: cluster.options.move_page_urls,
        ..proto::admin::CopyPartitionRequest::default()
    }
}

pub(in crate::cluster) fn decode_page(
    urls: Vec<proto::admin::PartitionUrl>,
) -> Result<Vec<PartitionUrl>, ClusterError> {
    urls.into_iter()
        .map(|moved| {
            let record =
                UrlRecord::decode(&moved.record).map_err(|e| ClusterError::UnreadableRecord {
                    url: moved.url.clone(),
                    reason: e.to_string(),
                })?;
            Ok(PartitionUrl {
                crawl: moved.crawl_id,
                url: moved.url,
                record,
            })
        })
        .collect()
}

pub(super) async fn take(
    cluster: &Cluster,
    partition: u32,
    urls: Vec<PartitionUrl>,
) -> Result<(), ClusterError> {
    let frontier = Arc::clone(&cluster.frontier);
    tokio::task::spawn_blocking(move || frontier.ingest().take_partition_urls(partition, urls))
        .await?
        .map(|_| ())
        .map_err(|e| ClusterError::Local(format!("cannot store the moved URLs: {e}")))
}

/// A queue's settings as they travel between nodes, from its record.
pub(in crate::cluster) fn moved_queue(
    crawl: &str,
    queue: &str,
    record: &crate::store::QueueRecord,
) -> proto::admin::MovedQueue {
    proto::admin::MovedQueue {
        crawl_id: crawl.to_owned(),
        key: queue.to_owned(),
        blocked_until: record.blocked_until,
        delay_ms: record.delay_ms,
        crawl_limit: record.crawl_limit,
    }
}

/// A queue's settings as they travel between nodes, as the scheduler
/// keeps them (its counts are the store's own).
pub(in crate::cluster) fn settings_of(
    queue: &proto::admin::MovedQueue,
) -> crate::store::QueueRecord {
    crate::store::QueueRecord {
        blocked_until: queue.blocked_until,
        delay_ms: queue.delay_ms,
        crawl_limit: queue.crawl_limit,
        ..crate::store::QueueRecord::default()
    }
}

/// The moved queues' settings, before the flip: serving under the new
/// owner starts with them.
pub(super) async fn take_queue_settings(
    cluster: &Cluster,
    queues: Vec<proto::admin::MovedQueue>,
) -> Result<(), ClusterError> {
    if queues.is_empty() {
        return Ok(());
    }
    let frontier = Arc::clone(&cluster.frontier);
    tokio::task::spawn_blocking(move || {
        for queue in queues {
            frontier.scheduler().set_queue_settings(
                &queue.crawl_id,
                &queue.key,
                settings_of(&queue),
            )?;
        }
        Ok::<(), crate::store::StoreError>(())
    })
    .await?
    .map_err(|e| ClusterError::Local(format!("cannot keep the moved queues' settings: {e}")))
}

pub(super) async fn drop_local(cluster: &Cluster, partition: u32) -> Result<(), ClusterError> {
    let frontier = Arc::clone(&cluster.frontier);
    tokio::task::spawn_blocking(move || frontier.ingest().drop_partition(partition))
        .await?
        .map(|_| ())
        .map_err(|e| ClusterError::Local(format!("cannot empty the partition here: {e}")))
}
