//! Why a worker cannot run.

use std::path::PathBuf;

use crate::fetch::FetchError;
use crate::frontier_link::LinkError;

/// Why a worker cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The frontier address is unusable.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The HTTP client could not be built.
    #[error("cannot set up HTTP: {0}")]
    Fetch(#[from] FetchError),
    /// The output directory cannot be written.
    #[error("cannot write output in {path}: {source}")]
    Output {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
}
