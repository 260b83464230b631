//! Settings of mimalloc, the allocator of the `frontier` and `crawl`
//! binaries.
//!
//! mimalloc gives a page it finds empty back to the system after a delay
//! (one second by default), and the next allocation there faults it in
//! again, zeroed. The frontier frees in waves: a group's held writes go
//! when the applier has written them, about once a second, and each wave
//! is allocated again by the next. With the default delay a profile of
//! the lease-and-report round trip spent a tenth of its time faulting
//! and zeroing pages the process had just given back. Empty pages are
//! kept for [`PURGE_DELAY_MS`] instead: a process that goes quiet still
//! gives its memory back, ten seconds later.

/// How long an empty page is kept before it goes back to the system.
pub const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// mimalloc 3's `mi_option_purge_delay`: the option's place in its
/// `mi_option_t` enum, which its Rust bindings do not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps empty pages for [`PURGE_DELAY_MS`], unless `MIMALLOC_PURGE_DELAY`
/// in the environment says otherwise (mimalloc reads it itself). Called
/// first thing in `main`.
pub fn keep_empty_pages() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        set_purge_delay(PURGE_DELAY_MS);
    }
}

fn set_purge_delay(ms: std::ffi::c_long) {
    // SAFETY: `mi_option_set` only stores a number in mimalloc's option
    // table, from any thread at any time; an option's place past the
    // table's end is ignored by mimalloc.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms);
    }
}

#[cfg(test)]
fn purge_delay() -> std::ffi::c_long {
    // SAFETY: as above, a read of the option table.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_the_option_mimalloc_reads() {
        // mimalloc's default for the purge delay, and no other option's:
        // a wrong place in the enum reads another number.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay(), 1_000);
        }
        keep_empty_pages();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay(), PURGE_DELAY_MS);
        }
    }
}
