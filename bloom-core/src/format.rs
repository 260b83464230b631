//! The snapshot format's version: a leaf, so that the error that names an
//! unsupported version and the snapshot code that writes it share it.

/// The snapshot format this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
