//! Filter snapshots in the data directory, so that a clean restart loads the
//! filters instead of rebuilding them from every stored URL.
//!
//! Layout: `filters/partition-<i>.bloom` (bloom-core's checksummed format)
//! and `filters/manifest`, which names the clean-shutdown token and the
//! partition count. The store records the same token after the snapshots
//! are durable, and clears it before its first write after start-up: the
//! snapshots are used only when both tokens agree, that is, when the store
//! has not changed since they were written. Every other case (a kill, a
//! missing, damaged or foreign file) rebuilds from the store.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use bloom_core::{BloomFilter, PartitionedBloom, SnapshotError};

const DIR: &str = "filters";
const MANIFEST: &str = "manifest";
/// How the filters' keys are made, named in the manifest: snapshots of
/// keys made otherwise (an older build keyed URLs by their text) are not
/// loaded, and the filters are rebuilt from the store.
const KEYS: &str = "keys=crawl-and-store-url-hash";

/// Why snapshots were not used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No manifest, or one for another shutdown or partition count.
    #[error("no snapshots of the current store ({0})")]
    Stale(String),
    /// A snapshot file is missing or damaged.
    #[error("snapshot {path} is unusable: {source}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: SnapshotError,
    },
    /// The directory could not be read.
    #[error("cannot read snapshots: {0}")]
    Io(#[from] std::io::Error),
}

fn partition_path(dir: &Path, partition: usize) -> PathBuf {
    dir.join(DIR).join(format!("partition-{partition}.bloom"))
}

/// Writes every partition's filter and then the manifest, each file through
/// a temporary name, synced and renamed into place.
pub fn write(data_dir: &Path, filters: &PartitionedBloom, token: u64) -> std::io::Result<()> {
    let dir = data_dir.join(DIR);
    std::fs::create_dir_all(&dir)?;
    // An old manifest must not vouch for files half replaced below.
    match std::fs::remove_file(dir.join(MANIFEST)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    for partition in 0..filters.partition_count() {
        let filter = filters
            .filter(partition)
            .map_err(|error| std::io::Error::other(error.to_string()))?;
        let path = partition_path(data_dir, partition);
        write_synced(&path, |out| {
            filter
                .write_snapshot(out)
                .map_err(|error| std::io::Error::other(error.to_string()))
        })?;
    }
    write_synced(&dir.join(MANIFEST), |out| {
        write!(
            out,
            "token={token}\npartitions={}\n{KEYS}\n",
            filters.partition_count()
        )
    })?;
    File::open(&dir)?.sync_all()
}

fn write_synced(
    path: &Path,
    contents: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let file = File::create(&temporary)?;
    {
        let mut out = BufWriter::new(&file);
        contents(&mut out)?;
        out.flush()?;
    }
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

/// Loads the snapshots written with `token` for `partitions` partitions.
pub fn load(data_dir: &Path, token: u64, partitions: usize) -> Result<Vec<BloomFilter>, LoadError> {
    let manifest = match std::fs::read_to_string(data_dir.join(DIR).join(MANIFEST)) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::Stale("no manifest".into()));
        }
        Err(error) => return Err(error.into()),
    };
    let expected = format!("token={token}\npartitions={partitions}\n{KEYS}\n");
    if manifest != expected {
        return Err(LoadError::Stale(format!(
            "manifest {:?} does not match token {token}, {partitions} partitions and {KEYS}",
            manifest.trim()
        )));
    }
    (0..partitions)
        .map(|partition| {
            let path = partition_path(data_dir, partition);
            let file = File::open(&path).map_err(|error| LoadError::Damaged {
                path: path.clone(),
                source: SnapshotError::Io(error),
            })?;
            BloomFilter::read_snapshot(BufReader::new(file))
                .map_err(|source| LoadError::Damaged { path, source })
        })
        .collect()
}
