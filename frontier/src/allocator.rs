//! Settings of mimalloc, the allocator of the `frontier` and `crawl`
//! binaries, and of the memory it takes from the system.
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
//!
//! mimalloc also asks for transparent huge pages, and the first touch of
//! a huge page has the kernel zero all of its 2 MiB at once, however
//! little of it the process goes on to use: the frontier grows through
//! its caches and held writes a few kilobytes at a time, across many
//! huge pages. The process runs on small pages instead, which in the
//! lease-and-report round trip cuts both its peak RSS and its time in
//! page faults (BENCHMARKS.md has the paired runs).

/// How long an empty page is kept before it goes back to the system.
pub const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// mimalloc 3's `mi_option_purge_delay`: the option's place in its
/// `mi_option_t` enum, which its Rust bindings do not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps empty pages for [`PURGE_DELAY_MS`], unless `MIMALLOC_PURGE_DELAY`
/// in the environment says otherwise (mimalloc reads it itself), and keeps
/// the process off transparent huge pages, unless `MIMALLOC_ALLOW_THP`
/// says otherwise. Called first thing in `main`.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        set_purge_delay(PURGE_DELAY_MS);
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        disallow_huge_pages();
    }
}

/// mimalloc 3's `mi_option_allow_thp`, as [`MI_OPTION_PURGE_DELAY`].
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Small pages from now on: for the whole process (the kernel's own
/// switch, which covers memory mimalloc mapped before `main` too), and
/// mimalloc stops asking for huge ones.
fn disallow_huge_pages() {
    // A kernel without the switch leaves them allowed: slower, no worse.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    // SAFETY: as in `set_purge_delay`.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
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
fn option(option: libmimalloc_sys::mi_option_t) -> std::ffi::c_long {
    // SAFETY: as above, a read of the option table.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_get(option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_set_are_those_mimalloc_reads() {
        // mimalloc's defaults for the two options, and no other option's:
        // a wrong place in the enum reads another number (the purge
        // delay's default is mimalloc's alone; huge pages are allowed
        // by default on Linux).
        let purge_default = std::env::var_os("MIMALLOC_PURGE_DELAY").is_none();
        let thp_default = std::env::var_os("MIMALLOC_ALLOW_THP").is_none();
        if purge_default {
            assert_eq!(option(MI_OPTION_PURGE_DELAY), 1_000);
        }
        if thp_default {
            assert_eq!(option(MI_OPTION_ALLOW_THP), 1);
        }
        configure();
        if purge_default {
            assert_eq!(option(MI_OPTION_PURGE_DELAY), PURGE_DELAY_MS);
        }
        if thp_default {
            assert_eq!(option(MI_OPTION_ALLOW_THP), 0);
            #[cfg(target_os = "linux")]
            assert!(rustix::thread::transparent_huge_pages_are_disabled().unwrap());
        }
    }
}
