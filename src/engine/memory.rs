//! How much memory the engine's cached entries cost: the sizes the cache
//! (`cache.rs`) and the reviewers (`agreement.rs`) charge their entries;
//! and `prefetch`, to load an entry's memory ahead.

use crate::input::Id;

/// A hash table slot costs its size plus a control byte, divided by the
/// load factor, which is 7/16 right after the table doubles and at least
/// that otherwise (a table only grows by doubling, and [`Engine::evict`]
/// shrinks one that eviction left below it): counting that worst case
/// keeps a table's memory within the budget at any load. `T` is the
/// table's (key, value) pair, whose size includes alignment padding.
pub(super) const fn slot<T>() -> usize {
    (std::mem::size_of::<T>() + 1) * 16 / 7
}

/// A heap block: the allocator's header and rounding to 16 bytes.
pub(super) const fn block(bytes: usize) -> usize {
    8 + bytes.div_ceil(16) * 16
}

/// The heap block of an id: none for one short enough to be held inline.
pub(super) fn id_block(id: &Id) -> usize {
    if id.is_heap_allocated() {
        // The shared string's reference counts, then its bytes.
        block(16 + id.len())
    } else {
        0
    }
}

/// Asks the CPU to start loading the cache line at `p`: a hint, with no
/// effect on what the program computes (a prefetch never faults, so `p`
/// may be dangling); nothing on other targets. Hand-written: one
/// intrinsic, which std has.
#[inline(always)]
pub(super) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and never faults.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
