//! The process's allocators: mimalloc for Rust's allocations, glibc's
//! (tuned) for RocksDB's and librdkafka's.

/// Rust's allocations (ids, events, batches, cache entries) go to mimalloc:
/// the issue-2 replay and `run` spend less CPU in the allocator than with
/// glibc's (docs/PERFORMANCE.md, "What made it fast"). RocksDB and librdkafka (C and
/// C++) keep glibc's allocator, tuned in [`tune_allocator`]; mimalloc's
/// defaults are set in [`mimalloc_options`].
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc 3's option numbers (`mi_option_e` in its `mimalloc.h`;
/// libmimalloc-sys names only version 2's). `mimalloc_options_are_v3s`
/// checks them against the defaults.
const MI_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// glibc's allocator (RocksDB, librdkafka) keeps up to 8 arenas per core
/// and returns freed memory lazily, which made the state cache's peak (hash
/// tables that double, write batches) cost twice its size in RSS. Two
/// arenas, and large blocks mapped and unmapped on their own, keep RSS near
/// the heap (measured in docs/PERFORMANCE.md). The MALLOC_* environment
/// variables still win.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (name, param, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 1 << 20),
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 1 << 20),
    ] {
        if std::env::var_os(name).is_none() {
            // SAFETY: mallopt only sets allocator parameters; called before
            // any other thread starts.
            unsafe { libc::mallopt(param, value) };
        }
    }
}

/// mimalloc returns freed pages after 1 s by default and commits its arenas
/// eagerly: the issue-2 replay peaked at 223 MiB against 139 MiB with
/// glibc. Returning them at once, and committing on demand, keeps it at
/// glibc's peak for most of the speed. The `MIMALLOC_*` environment
/// variables still win.
///
/// These defaults must precede mimalloc's first allocation, which Rust's
/// runtime makes before `main`: the function runs from the executable's
/// `.preinit_array`, before any initializer of a library and of Rust's
/// runtime. (The `ctor` crate does the same through `.init_array`, where
/// the order between libraries is not defined.)
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".preinit_array")]
static MIMALLOC_OPTIONS: extern "C" fn() = mimalloc_options;

#[cfg(target_os = "linux")]
extern "C" fn mimalloc_options() {
    // SAFETY: sets defaults that an environment variable overrides; runs
    // before any thread starts (the calls are not thread safe).
    unsafe {
        libmimalloc_sys::mi_option_set_default(MI_PURGE_DELAY, 0);
        libmimalloc_sys::mi_option_set_default(MI_ARENA_EAGER_COMMIT, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are in force in this (test) executable too, and the
    /// option numbers are mimalloc 3's: its neighbours hold their `options.c`
    /// defaults (os_tag 100, max_errors 32, purge_decommits 1). Fails when
    /// an upgrade renumbers them.
    #[test]
    #[cfg(target_os = "linux")]
    fn mimalloc_options_are_v3s() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some()
            || std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_some()
        {
            return;
        }
        // SAFETY: reads an option; no other thread sets one.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        assert_eq!((get(MI_PURGE_DELAY), get(MI_ARENA_EAGER_COMMIT)), (0, 0));
        assert_eq!((get(18), get(19), get(5)), (100, 32, 1));
    }
}
