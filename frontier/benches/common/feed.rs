//! The PutDiscovered feed of the gRPC benchmarks: the URL stream of
//! [`crate::common::url`] in batches of 256, over several concurrent
//! streams, with the rate recorded at each tenth of the run, each batch's
//! ack latency (from when the client took the batch to send until its ack
//! arrived), and the whole seconds that passed without an ack.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use proto::urlfrontier::{self as uf, url_frontier_client::UrlFrontierClient};
use tonic::transport::Channel;

/// What a feed got back.
pub struct Fed {
    /// URLs acked OK.
    pub stored: usize,
    /// URLs acked SKIPPED (known already, or refused for good).
    pub skipped: usize,
    /// URLs acked FAIL (to be sent again).
    #[allow(dead_code, reason = "not every bench that includes the feed prints it")]
    pub failed: usize,
    /// (URLs acked so far, seconds since the start) at each tenth.
    pub tenths: Vec<(usize, f64)>,
    /// Each acked batch's latency, milliseconds, sorted.
    #[allow(dead_code, reason = "not every bench that includes the feed prints it")]
    pub latencies_ms: Vec<f64>,
    /// Acks in each whole second since the start.
    #[allow(dead_code, reason = "not every bench that includes the feed prints it")]
    pub acks_per_second: Vec<usize>,
}

#[allow(
    dead_code,
    reason = "not every bench that includes the feed prints these"
)]
impl Fed {
    /// The latency at quantile `q` (0 to 1), milliseconds.
    pub fn latency_ms(&self, q: f64) -> f64 {
        let last = self.latencies_ms.len().saturating_sub(1);
        self.latencies_ms
            .get(((last as f64) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    }

    /// Whole seconds of the feed in which no batch was acked.
    pub fn seconds_without_acks(&self) -> usize {
        self.acks_per_second.iter().filter(|&&n| n == 0).count()
    }

    /// Which whole seconds of the feed (from its start) had no ack.
    pub fn silent_seconds(&self) -> Vec<usize> {
        (self.acks_per_second.iter().enumerate())
            .filter_map(|(second, &n)| (n == 0).then_some(second))
            .collect()
    }
}

/// Sends `batches` over `streams` PutDiscovered streams and counts the
/// acks. A stream that fails (a server killed mid-feed) ends there: the
/// counts are of what was acknowledged.
#[allow(
    dead_code,
    reason = "not every bench that includes the feed sends without a window"
)]
pub async fn put_discovered(
    client: &UrlFrontierClient<Channel>,
    batches: Range<usize>,
    streams: usize,
) -> Fed {
    put_discovered_within(client, batches, streams, None).await
}

/// As [`put_discovered`], each stream keeping at most `window` batches
/// unacknowledged when given (as a worker does), instead of sending as far
/// ahead as flow control allows.
#[allow(
    dead_code,
    reason = "not every bench that includes the feed sends within a window"
)]
pub async fn put_discovered_within(
    client: &UrlFrontierClient<Channel>,
    batches: Range<usize>,
    streams: usize,
    window: Option<usize>,
) -> Fed {
    let started = Instant::now();
    let done = AtomicUsize::new(0);
    let tenths = Mutex::new(Vec::new());
    let latencies = Mutex::new(Vec::new());
    let ack_times = Mutex::new(Vec::new());
    let tenth = (batches.len() * 256 / 10).max(256);
    let tasks = (0..streams).map(|stream| {
        let mut client = client.clone();
        let (done, tenths, latencies, ack_times) = (&done, &tenths, &latencies, &ack_times);
        let ids = (batches.start + stream..batches.end).step_by(streams);
        let sent_at = std::sync::Arc::new(Mutex::new(HashMap::new()));
        let sending = std::sync::Arc::clone(&sent_at);
        let room = std::sync::Arc::new(tokio::sync::Semaphore::new(
            window.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
        ));
        let taking = std::sync::Arc::clone(&room);
        async move {
            let requests = futures::StreamExt::then(futures::stream::iter(ids), move |batch| {
                let (sending, taking) = (
                    std::sync::Arc::clone(&sending),
                    std::sync::Arc::clone(&taking),
                );
                async move {
                    if let Ok(permit) = taking.acquire().await {
                        permit.forget();
                    }
                    sending
                        .lock()
                        .unwrap()
                        .insert(batch.to_string(), Instant::now());
                    uf::DiscoveredBatch {
                        id: batch.to_string(),
                        done: None,
                        items: (0..256)
                            .map(|i| uf::UrlInfo {
                                url: crate::common::url(batch, batch * 256 + i),
                                ..uf::UrlInfo::default()
                            })
                            .collect(),
                    }
                }
            });
            let (mut stored, mut skipped, mut failed) = (0, 0, 0);
            let Ok(acks) = client.put_discovered(requests).await else {
                return (stored, skipped, failed);
            };
            let mut acks = acks.into_inner();
            while let Ok(Some(ack)) = acks.message().await {
                let now = Instant::now();
                room.add_permits(1);
                if let Some(sent) = sent_at.lock().unwrap().remove(&ack.id) {
                    latencies
                        .lock()
                        .unwrap()
                        .push(now.duration_since(sent).as_secs_f64() * 1000.0);
                }
                ack_times
                    .lock()
                    .unwrap()
                    .push(now.duration_since(started).as_secs_f64());
                for status in ack.statuses {
                    if status == uf::ack_message::Status::Ok as i32 {
                        stored += 1;
                    } else if status == uf::ack_message::Status::Fail as i32 {
                        failed += 1;
                    } else {
                        skipped += 1;
                    }
                }
                let so_far = done.fetch_add(256, Ordering::Relaxed) + 256;
                if so_far % tenth < 256 {
                    tenths
                        .lock()
                        .unwrap()
                        .push((so_far, started.elapsed().as_secs_f64()));
                }
            }
            (stored, skipped, failed)
        }
    });
    let (stored, skipped, failed) = futures::future::join_all(tasks)
        .await
        .into_iter()
        .fold((0, 0, 0), |(a, b, c), (d, e, f)| (a + d, b + e, c + f));
    let mut tenths = tenths.into_inner().unwrap();
    tenths.sort_by_key(|mark| mark.0);
    let mut latencies_ms = latencies.into_inner().unwrap();
    latencies_ms.sort_by(f64::total_cmp);
    let ack_times = ack_times.into_inner().unwrap();
    let last = ack_times.iter().copied().fold(0.0, f64::max);
    let mut acks_per_second = vec![0; last as usize + 1];
    for at in ack_times {
        acks_per_second[at as usize] += 1;
    }
    Fed {
        stored,
        skipped,
        failed,
        tenths,
        latencies_ms,
        acks_per_second,
    }
}

/// The rate over each tenth, as "r1 · r2 · ...".
pub fn rates_per_tenth(tenths: &[(usize, f64)]) -> String {
    let mut previous = (0, 0.0);
    tenths
        .iter()
        .map(|&(count, at)| {
            let rate = (count - previous.0) as f64 / (at - previous.1).max(1e-9);
            previous = (count, at);
            format!("{rate:.0}")
        })
        .collect::<Vec<_>>()
        .join(" · ")
}
