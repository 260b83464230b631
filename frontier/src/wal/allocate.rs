//! Allocating a log's bytes ahead of its records, written as zeros.
//!
//! Written (not merely allocated) blocks are what make a record's
//! `fdatasync` a flush of data alone: a write into allocated but unwritten
//! blocks, like one that extends the file, also has the file system commit
//! its journal. The zeros go around the page cache (`O_DIRECT`) where the
//! file system allows: copied into the cache, hundreds of megabytes of
//! them take the process and the kernel's writeback CPU that the records
//! logged meanwhile need, and push the store's pages out of the cache.
//! Where it does not, or for the ends of the range that are not whole
//! blocks, they are written through the cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// What offsets, lengths and buffers of direct writes are multiples of:
/// the largest logical block of Linux's disks and file systems.
const DIRECT_ALIGN: u64 = 4096;

/// Zeros synced at a time: a log sync issued meanwhile (every group's
/// answer waits on one) then waits behind one chunk at most, not behind
/// all the zeros at once.
const SYNCED_CHUNK: u64 = 16 << 20;

/// The zeros written, aligned for direct writes.
#[repr(C, align(4096))]
struct AlignedZeros([u8; 1 << 20]);

static ZEROS: AlignedZeros = AlignedZeros([0; 1 << 20]);

/// Allocates the bytes of `file` (at `path`) from `from` to `to` and
/// writes zeros over them, synced a chunk at a time. Where the file system
/// cannot allocate ahead, the zeros are written all the same.
pub(super) fn allocate(file: &File, path: &Path, from: u64, to: u64) -> std::io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), from, to - from) {
        Ok(()) | Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {}
        Err(errno) => return Err(errno.into()),
    }
    // A file system without direct I/O refuses the open (EINVAL).
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .ok();
    let whole_blocks_from = from.next_multiple_of(DIRECT_ALIGN).min(to);
    let whole_blocks_to = (to / DIRECT_ALIGN * DIRECT_ALIGN).max(whole_blocks_from);
    let mut zeroing = Zeroing {
        file,
        direct,
        from,
        at: from,
        to,
    };
    zeroing.through_cache(whole_blocks_from)?;
    zeroing.around_cache(whole_blocks_to)?;
    zeroing.through_cache(to)
}

/// A range being zeroed, up to `at`.
struct Zeroing<'f> {
    file: &'f File,
    direct: Option<File>,
    from: u64,
    at: u64,
    to: u64,
}

impl Zeroing<'_> {
    fn through_cache(&mut self, until: u64) -> std::io::Result<()> {
        while self.at < until {
            let length = (until - self.at).min(ZEROS.0.len() as u64);
            self.file
                .write_all_at(&ZEROS.0[..length as usize], self.at)?;
            self.advance(length)?;
        }
        Ok(())
    }

    /// Whole blocks from `at` (a block's start) to `until` (another's),
    /// directly; through the cache once a direct write is refused.
    fn around_cache(&mut self, until: u64) -> std::io::Result<()> {
        while self.at < until {
            let Some(direct) = &self.direct else {
                return self.through_cache(until);
            };
            let length = (until - self.at).min(ZEROS.0.len() as u64);
            match direct.write_at(&ZEROS.0[..length as usize], self.at) {
                Ok(written) => {
                    let written = written as u64;
                    // A short write that ends inside a block leaves the
                    // rest to the cache's writes.
                    if written == 0 || !written.is_multiple_of(DIRECT_ALIGN) {
                        self.direct = None;
                    }
                    self.advance(written)?;
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error)
                    if error.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) =>
                {
                    self.direct = None;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Counts `length` more bytes zeroed, syncing each chunk's end before
    /// the range's.
    fn advance(&mut self, length: u64) -> std::io::Result<()> {
        let before = (self.at - self.from) / SYNCED_CHUNK;
        self.at += length;
        if self.at < self.to && (self.at - self.from) / SYNCED_CHUNK > before {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_in(dir: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .unwrap()
    }

    /// Zeros written in synced chunks still cover the whole range, from
    /// and to offsets that are not a chunk's or a block's, over earlier
    /// bytes, some of them still in the page cache only.
    #[test]
    fn allocate_zeroes_the_whole_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = file_in(dir.path());
        file.write_all_at(&[7; 3 * 4096], 0).unwrap();
        file.sync_data().unwrap();
        file.write_all_at(&[9; 2 * 4096], 5 * 4096).unwrap();
        let (from, to) = (1000, (32 << 20) + 4321);
        allocate(&file, &path, from, to).unwrap();
        assert_eq!(file.metadata().unwrap().len(), to);
        let mut bytes = vec![1; to as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        assert!(bytes[..1000].iter().all(|&b| b == 7));
        assert!(bytes[1000..].iter().all(|&b| b == 0));
    }

    /// Ranges inside one block, ending on one, and on block boundaries
    /// all read back as zeros, with the bytes around them kept.
    #[test]
    fn ranges_of_every_alignment_are_zeroed_exactly() {
        for (from, to) in [
            (10, 20),
            (100, 4096),
            (4096, 8192),
            (4000, 3 * 4096 + 1),
            (0, 1),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let file = file_in(dir.path());
            let end = to + 5000;
            file.write_all_at(&vec![3; end as usize], 0).unwrap();
            allocate(&file, &dir.path().join("f"), from, to).unwrap();
            let mut bytes = vec![1; end as usize];
            file.read_exact_at(&mut bytes, 0).unwrap();
            let (from, to) = (from as usize, to as usize);
            assert!(bytes[..from].iter().all(|&b| b == 3), "{from}..{to}");
            assert!(bytes[from..to].iter().all(|&b| b == 0), "{from}..{to}");
            assert!(bytes[to..].iter().all(|&b| b == 3), "{from}..{to}");
        }
    }

    /// Where direct writes are refused, whole blocks go through the cache.
    #[test]
    fn whole_blocks_are_zeroed_without_direct_writes_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_in(dir.path());
        file.write_all_at(&[5; 3 * 4096], 0).unwrap();
        let mut zeroing = Zeroing {
            file: &file,
            direct: None,
            from: 4096,
            at: 4096,
            to: 2 * 4096,
        };
        zeroing.around_cache(2 * 4096).unwrap();
        let mut bytes = vec![1; 3 * 4096];
        file.read_exact_at(&mut bytes, 0).unwrap();
        assert!(bytes[..4096].iter().all(|&b| b == 5));
        assert!(bytes[4096..2 * 4096].iter().all(|&b| b == 0));
        assert!(bytes[2 * 4096..].iter().all(|&b| b == 5));
    }
}
