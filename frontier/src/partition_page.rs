//! A partition's URLs as they travel between nodes (CopyPartition and
//! SealPartition pages): how many a page holds and their wire form. Shared
//! by the admin service that answers pages and the cluster that asks.

/// URLs in a CopyPartition or SealPartition answer unless the caller asks
/// for fewer, and the most it may ask for.
const COPY_PAGE: usize = 4096;
const MAX_COPY_PAGE: usize = 16 * 1024;
/// A CopyPartition or SealPartition answer ends once its URLs pass this
/// many bytes (URLs may carry up to 16 KiB of metadata each), well under a
/// message's limit.
const COPY_PAGE_BYTES: usize = 2 << 20;

/// The URLs a page asked for `asked` holds at most.
pub fn copy_page_limit(asked: u32) -> usize {
    match asked {
        0 => COPY_PAGE,
        limit => (limit as usize).min(MAX_COPY_PAGE),
    }
}

/// A page of a partition's URLs as they travel, cut once it passes
/// `COPY_PAGE_BYTES`; answers whether it was cut (the next page then
/// goes on after its last key).
pub fn wire_page(
    page: Vec<crate::ingest::PartitionUrl>,
) -> (Vec<proto::admin::PartitionUrl>, bool) {
    let read = page.len();
    let mut urls = Vec::with_capacity(read);
    let mut bytes = 0;
    for moved in page {
        if bytes >= COPY_PAGE_BYTES {
            break;
        }
        let record = moved.record.encode();
        bytes += moved.crawl.len() + moved.url.len() + record.len();
        urls.push(proto::admin::PartitionUrl {
            crawl_id: moved.crawl,
            url: moved.url,
            record,
        });
    }
    let cut = urls.len() < read;
    (urls, cut)
}
